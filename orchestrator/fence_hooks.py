"""overnight's git hooks for the agent's commands, as bash text, and the test they share with the git front
(git_front.py) of whether a repository is the user's. In the user's repository, `reference-transaction` refuses a
change to any ref but the task's branch and the worktree's own, and `pre-push` refuses every push, a push into the
user's repository from a clone of the agent's too. confinement.py writes them with this machine's bash and git in
place of BASH and REAL_GIT.
"""

from __future__ import annotations

# Whether git's repository (GIT_DIR in a hook, or the one the arguments before the
# subcommand name) is the user's: a repository the agent made for itself is its own.
USERS_REPOSITORY_TESTS = r"""
in_users_repository() {
  [[ -n "$OVERNIGHT_COMMON_DIR" ]] || return 1
  local common
  common=$(REAL_GIT "$@" rev-parse --path-format=absolute --git-common-dir 2>/dev/null) || return 1
  [[ "$common" -ef "$OVERNIGHT_COMMON_DIR" ]]
}
# Whether a push destination (a path, or a file:// URL) is the user's repository.
names_users_repository() {
  local to=${1#file://}
  [[ -e "$to" ]] && (unset GIT_DIR GIT_WORK_TREE GIT_COMMON_DIR GIT_INDEX_FILE GIT_OBJECT_DIRECTORY; in_users_repository -C "$to")
}
"""
# Per-worktree refs (HEAD and the like have no refs/ prefix) may move; remote-tracking ones may move
# forward with a fetch, but not be deleted: a pruned one can be the user's last name for unmerged commits.
REF_GUARD = "#!BASH" + USERS_REPOSITORY_TESTS + r"""
[[ "$1" == prepared ]] && in_users_repository || exit 0
while read -r old new ref; do
  case "$ref" in
    "$OVERNIGHT_BRANCH"|refs/bisect/*|refs/worktree/*|refs/rewritten/*) ;;
    refs/remotes/*)
      if [[ "$new" =~ ^0+$ ]]; then
        echo "overnight: refused: git here may not delete $ref, which the user's repository shares" >&2
        exit 1
      fi ;;
    refs/*)
      echo "overnight: refused: git here may change only the branch ${OVERNIGHT_BRANCH#refs/heads/}, not $ref, which the user's repository shares" >&2
      exit 1 ;;
  esac
done
exit 0
"""
PUSH_REFUSAL = "#!BASH" + USERS_REPOSITORY_TESTS + r"""
# From a clone of the agent's too, when it pushes into the user's repository ($2: where to): there receive-pack
# runs without the environment's settings, and a core.hooksPath of the repository's own (husky) beats overnight's.
if ! in_users_repository; then
  names_users_repository "$2" || exit 0
fi
echo "overnight: refused: nothing is pushed from an overnight worktree; a person reviews the branch in the morning" >&2
exit 1
"""
