"""What a night keeps in the state dir (docs/reference.md, "Files"), each named once here."""

NOTES_FILE, STORE_FILE, WORKTREES_FOLDER, TRANSCRIPTS_FOLDER = "notes.md", "runs.db", "worktrees", "transcripts"
GIT_CONFIG_COPY = "git-config.kept"
SERVE_NIGHT_MARKER, LOCAL_SERVER_LOG = "serve-night-started", "llama-server.log"
