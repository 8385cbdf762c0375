"""The front for git first on the agent's PATH, as bash text: what it refuses before git runs, and what it adds
to a fetch and a push (confinement.py's docstring lists them). confinement.py writes it with this machine's bash
and git, overnight's settings and hooks, git's own commands and the exec path of links (git_exec_path.py) in place
of BASH, REAL_GIT, GIT_OWN_COMMANDS and FENCE_*.
"""

from __future__ import annotations

from orchestrator.fence_hooks import USERS_REPOSITORY_TESTS

GIT_FRONT = "#!BASH" + USERS_REPOSITORY_TESTS + r"""
# Run by a dashed name of git's (git-stash, a link in the folder of links that git puts first on PATH for what it runs:
# `rebase --exec 'git-stash drop'`), which git itself would run as `git stash`: judged as that.
program=${0##*/}
[[ "$program" == git-?* ]] && set -- "${program#git-}" "$@"
# The options before the subcommand, the subcommand, and its arguments. Those git takes a value of as the next
# word (--shallow-file, --attr-source: git >= 2.42, --super-prefix: before 2.41) too: else the value was taken for the
# subcommand, and `git --shallow-file '' stash drop` dropped the user's stash past every check below.
split_arguments() {
  local args=("$@") at=0
  while (( at < ${#args[@]} )); do
    case "${args[at]}" in
      -C|-c|--git-dir|--work-tree|--namespace|--config-env|--shallow-file|--attr-source|--super-prefix) at=$((at + 2)) ;;
      -*) at=$((at + 1)) ;;
      *) break ;;
    esac
  done
  before=("${args[@]:0:at}"); command=${args[at]}; rest=("${args[@]:at+1}")
}
split_arguments "$@"
refuse() {
  if in_users_repository "${before[@]}"; then
    echo "overnight: refused: $1" >&2
    exit 1
  fi
}
# Git reads GIT_CONFIG_COUNT as strtoul does, in base 10 ("08", " 8" and "+8" are 8): so does this front,
# which names overnight's settings after the command's own; a count git refuses is refused alike.
read_config_count() {
  local text=${GIT_CONFIG_COUNT-}
  count=0
  [[ -z "$text" ]] && return
  if [[ ! "$text" =~ ^[[:space:]]*([+-]?)0*([0-9]*)$ || "$text" != *[0-9]* ]]; then
    echo "fatal: bogus count in GIT_CONFIG_COUNT: unable to parse command-line config" >&2
    exit 128
  fi
  local sign=${BASH_REMATCH[1]} digits=${BASH_REMATCH[2]:-0}
  # A negative one wraps around to a huge unsigned number in git.
  if [[ ( "$sign" == - && "$digits" != 0 ) || ${#digits} -gt 10 ]] || (( 10#$digits > 2147483647 )); then
    echo "fatal: too many entries in GIT_CONFIG_COUNT: unable to parse command-line config" >&2
    exit 128
  fi
  count=$((10#$digits))
}
# Whether git's list of settings from the environment ends with these (key value key value ...).
config_ends_with() {
  local at=$((count - $# / 2)) key value
  (( at >= 0 )) || return 1
  while (( $# )); do
    key=GIT_CONFIG_KEY_$at value=GIT_CONFIG_VALUE_$at
    [[ -n "${!key+set}" && -n "${!value+set}" && "${!key}" == "$1" && "${!value}" == "$2" ]] || return 1
    shift 2
    at=$((at + 1))
  done
}
append_config() {
  while (( $# )); do
    export "GIT_CONFIG_KEY_$count=$1" "GIT_CONFIG_VALUE_$count=$2"
    count=$((count + 1))
    shift 2
  done
  export "GIT_CONFIG_COUNT=$count"
}
# What git runs (rebase --exec, bisect run, submodule foreach, an alias's shell, a hook, a pager) finds git's
# exec path first on PATH, and the real git in it: given a folder of overnight's, where git is this front and
# all else is git's own, the git those run meets these checks too. Unless git's own is gone (an upgrade removed
# its versioned folder, as Homebrew's cleanup does): the folder's links lead nowhere then, and git finds its own.
# A git upgraded in place (its exec path keeps its name) may have programs the folder, made at the night's start,
# lacks: git looks for them on PATH too, where git's own exec path is put last, after this front and the user's
# folders, so that no git but this front comes before it.
exec_path=FENCE_EXEC_PATH
if [[ -n "$exec_path" && -d FENCE_GITS_EXEC_PATH ]]; then
  export GIT_EXEC_PATH=$exec_path
  [[ ":$PATH:" == *:FENCE_GITS_EXEC_PATH:* ]] || export PATH=$PATH:FENCE_GITS_EXEC_PATH
elif [[ -n "$exec_path" && "${GIT_EXEC_PATH-}" == "$exec_path" ]]; then
  unset GIT_EXEC_PATH
fi
# Overnight's settings, as agent_environment gives them (the hooks last, where they win). A command's own
# GIT_CONFIG_COUNT (GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=user.name ...) makes git read its list instead of
# them: they are named again after it (the later one wins), in the user's repository all of them, in a
# repository of the agent's (a test suite's fixture) all but the hooks it may name itself.
settings=(FENCE_SETTINGS)
[[ -n "$OVERNIGHT_BRANCH" ]] && settings+=(core.hooksPath FENCE_HOOKS)
own_repository_settings=(FENCE_OWN_REPOSITORY_SETTINGS)
read_config_count
if ! config_ends_with "${settings[@]}"; then
  if in_users_repository "${before[@]}"; then
    append_config "${settings[@]}"
  elif ! config_ends_with "${own_repository_settings[@]}"; then
    append_config "${own_repository_settings[@]}"
  fi
fi
# Settings given on the command line (GIT_CONFIG_PARAMETERS, which `-c` fills) come after those: one that
# names hooks or includes a file (which could name them) would switch overnight's hooks off.
switches_hooks_off() {
  shopt -s nocasematch
  local found=1
  [[ "$1" == *core.hookspath* || "$1" == *include.path* || "$1" == *includeif.* ]] && found=0
  shopt -u nocasematch
  return $found
}
hooks_refusal="git's hooks here are overnight's; they keep the user's branches and remotes as they are: run git without that setting"
switches_hooks_off "${GIT_CONFIG_PARAMETERS:-}" && refuse "$hooks_refusal"
# An alias runs what it expands to (a builtin of the same name wins over it): judged as that, as often
# as it names another alias. One that runs a shell is refused: where git's exec path, which git puts
# first on PATH for it, is not overnight's folder, its git would run past this front.
seen=" "
# git's own commands (its builtins and the programs of its exec path, listed when this front was
# written) win over an alias: they need no look-up (a git process each, on every plumbing call of a
# test suite or a pre-commit tool).
own_commands=" GIT_OWN_COMMANDS "
while [[ -n "$command" && "$command" != -* && "$seen" != *" $command "* && "$own_commands" != *" $command "* ]] &&
      expansion=$(REAL_GIT "${before[@]}" config --get "alias.$command" 2>/dev/null) &&
      ! REAL_GIT --list-cmds=builtins,main,others 2>/dev/null | grep -qxF -- "$command"; do
  [[ "$expansion" == '!'* ]] &&
    refuse "git $command is an alias that runs a shell, whose git would skip overnight's checks; run its commands yourself: ${expansion#!}"
  seen+="$command "
  # Split as git splits it (quotes, backslashes); read, not mapfile -d, which macOS's bash 3.2 lacks.
  words=()
  while IFS= read -r -d '' word; do words+=("$word"); done < <(printf '%s' "$expansion" | xargs printf '%s\0' 2>/dev/null)
  split_arguments "${before[@]}" "${words[@]}" "${rest[@]}"
done
# The worktree's own git dir, as its .git file names it (where git itself finds it): read, no git started.
read_own_git_dir() {
  local line
  [[ -f "$OVERNIGHT_WORKTREE/.git" ]] && IFS= read -r line < "$OVERNIGHT_WORKTREE/.git" && [[ "$line" == "gitdir: "* ]] || return 1
  own_git_dir=${line#gitdir: }
  [[ "$own_git_dir" == /* ]] || own_git_dir=$OVERNIGHT_WORKTREE/$own_git_dir
}
# Whether the repository's config turns per-worktree config on (extensions.worktreeConfig), with which git reads a
# core.worktree for a linked worktree too: any mention of it, read without a git started.
names_worktree_config() {
  local text=
  [[ -r "$OVERNIGHT_COMMON_DIR/config" ]] && IFS= read -r -d '' text < "$OVERNIGHT_COMMON_DIR/config"
  shopt -s nocasematch
  local found=1
  [[ "$text" == *worktreeconfig* ]] && found=0
  shopt -u nocasematch
  return $found
}
# What git runs in the worktree's top (rebase --exec, bisect run, a hook) has GIT_DIR set to the worktree's own git
# dir, and no other place named: git's top is then the current folder, the worktree's, and its index the git dir's,
# the worktree's own, as the four `git rev-parse` of the check below would find (~16 ms a command). A linked
# worktree's git dir (with a commondir) takes no core.worktree but with per-worktree config on.
in_worktree_top_with_its_own_git_dir() {
  [[ ${#before[@]} -eq 0 && -n "$GIT_DIR" && -z "$GIT_WORK_TREE$GIT_INDEX_FILE$GIT_COMMON_DIR" ]] && [[ . -ef "$OVERNIGHT_WORKTREE" ]] &&
    read_own_git_dir && [[ "$GIT_DIR" -ef "$own_git_dir" && -f "$own_git_dir/commondir" ]] && ! names_worktree_config
}
# Whether the options before the subcommand name a work tree (--work-tree), which a GIT_DIR leaves to them.
names_work_tree() {
  local arg
  for arg in "$@"; do [[ "$arg" == --work-tree || "$arg" == --work-tree=* ]] && return 0; done
  return 1
}
# git would change files outside the worktree's top: a folder above it, another checkout, or, with GIT_DIR set and
# no work tree named (as git sets it for what it runs: rebase --exec, bisect run, a hook), a folder in the worktree,
# which git then takes for the top (`cd sub && git add x` there would stage sub/x as x).
refuse_other_top() {
  local top=$1 root pasted
  root=$(cd "$OVERNIGHT_WORKTREE" 2>/dev/null && pwd -P)
  if [[ -n "$root" && "$top" == "$root"/* && ( -n "$GIT_DIR" || " ${before[*]} " == *" --git-dir"* ) && -z "$GIT_WORK_TREE" ]] &&
     ! names_work_tree "${before[@]}"; then
    # Quoted as a shell reads it: the model pastes it into its command, and a root's space or `*` would split or glob it.
    printf -v pasted '%q' "$root"
    echo "overnight: refused: git with GIT_DIR set (as git sets it for what it runs: rebase --exec, bisect run, a hook) takes the current folder, ${top#"$root"/}, for the top of the worktree and would write its files as the top's; in that command run git from the project root (cd $pasted first, or git -C $pasted), naming paths from there" >&2
    exit 1
  fi
  echo "overnight: refused: git here would change $top, not this task's worktree; every command starts in the project root: run git from there" >&2
  exit 1
}
# Outside this task's worktree (`cd ../other-task`, the user's own checkout), a command that writes
# an index or files would write the user's: refused when the repository is the user's. In the
# worktree (git then finds its own .git, or a repository the agent made) no git runs to ask.
case "$command" in
  add|stage|rm|mv|reset|restore|checkout|switch|clean|commit|merge|rebase|cherry-pick|revert|am|apply|pull|\
  read-tree|update-index|checkout-index|sparse-checkout|submodule|bisect|mergetool)
    # A ':' above the worktree splits GIT_CEILING_DIRECTORIES (git has no escape for it): git may
    # climb out of the worktree itself then, so the repository is asked there too.
    if [[ ${#before[@]} -gt 0 || -n "$GIT_DIR$GIT_WORK_TREE$GIT_INDEX_FILE" || "$OVERNIGHT_WORKTREE" == *:* ||
          ( "$PWD" != "$OVERNIGHT_WORKTREE" && "$PWD" != "$OVERNIGHT_WORKTREE"/* ) ]] &&
       ! in_worktree_top_with_its_own_git_dir && in_users_repository "${before[@]}"; then
      top=$(REAL_GIT "${before[@]}" rev-parse --show-toplevel 2>/dev/null)
      [[ -n "$top" && ! "$top" -ef "$OVERNIGHT_WORKTREE" ]] && refuse_other_top "$top"
      # The worktree's files with the index of the user's checkout or another task's (GIT_DIR=<the user's
      # .git> GIT_WORK_TREE=.): refused; a temporary index of the command's own is its own.
      index=$(REAL_GIT "${before[@]}" rev-parse --path-format=absolute --git-path index 2>/dev/null)
      own=$(unset GIT_DIR GIT_WORK_TREE GIT_COMMON_DIR GIT_INDEX_FILE GIT_OBJECT_DIRECTORY
            cd "$OVERNIGHT_WORKTREE" 2>/dev/null && REAL_GIT rev-parse --path-format=absolute --git-path index 2>/dev/null)
      index_folder=$(cd "${index%/*}" 2>/dev/null && pwd -P) shared=$(cd "$OVERNIGHT_COMMON_DIR" && pwd -P)
      # A temporary index beside the worktree's own (a pre-commit tool's, in `git rev-parse --git-dir`) is its own too.
      own_folder=$(cd "${own%/*}" 2>/dev/null && pwd -P)
      if [[ -n "$index" && "$index_folder/" == "$shared/"* && ( -z "$own" || "$index_folder" != "$own_folder" ) ]]; then
        echo "overnight: refused: git here would write $index, not this task's worktree's index; run git without GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE, --git-dir or --work-tree" >&2
        exit 1
      fi
    fi ;;
esac
# Settings given before the subcommand that would switch overnight's hooks off (-c core.hooksPath=...).
for (( i = 0; i < ${#before[@]}; i++ )); do
  case "${before[i]}" in
    -c) setting=${before[i+1]:-} ;;
    -c*) setting=${before[i]#-c} ;;
    --config-env|--config-env=*) setting=${before[i]#--config-env=}; [[ "$setting" == --config-env ]] && setting=${before[i+1]:-} ;;
    *) continue ;;
  esac
  switches_hooks_off "$setting" && refuse "$hooks_refusal"
done
case "$command" in
  push|send-pack)
    # The pre-push hook says the same, but --no-verify skips it.
    refuse "nothing is pushed from an overnight worktree; a person reviews the branch in the morning"
    # From a repository of the agent's (a clone), the pre-push hook asks whether the destination is the user's
    # repository, where a core.hooksPath of its own (husky's) keeps overnight's hooks out of receive-pack: so
    # it is not skipped here (--no-verify, a hooks path of the command's), and send-pack, which runs no
    # pre-push hook, may not name the user's repository.
    if [[ -n "$OVERNIGHT_COMMON_DIR" ]]; then
      kept=(); options=1
      # git resolves a relative destination from the folder it runs in: the top of the work tree (or the
      # repository, bare), not the command's folder.
      base=$(REAL_GIT "${before[@]}" rev-parse --show-toplevel 2>/dev/null) ||
        base=$(REAL_GIT "${before[@]}" rev-parse --absolute-git-dir 2>/dev/null) || base=$PWD
      for arg in "${rest[@]}"; do
        if [[ -n "$options" ]]; then
          if [[ "$arg" == -- ]]; then options=; kept+=("$arg"); continue; fi
          [[ "$command" == push && ${#arg} -ge 9 && "--no-verify" == "$arg"* ]] && continue
        fi
        to=${arg#file://}
        [[ "$to" == /* ]] || to=$base/$to
        if [[ "$command" == send-pack && ( -z "$options" || "$arg" != -* ) ]] && names_users_repository "$to"; then
          echo "overnight: refused: nothing is pushed into the user's repository; a person reviews the branch in the morning" >&2
          exit 1
        fi
        kept+=("$arg")
      done
      shopt -s nocasematch
      for (( i = 0; i < ${#before[@]}; i++ )); do
        [[ "${before[i]}" == *core.hookspath* ]] && { echo "overnight: refused: git's hooks here are overnight's when pushing" >&2; exit 1; }
      done
      shopt -u nocasematch
      exec REAL_GIT "${before[@]}" "$command" "${kept[@]}"
    fi ;;
  stash)
    # `create` makes a commit and no ref, `apply` of an object id applies that commit and drops no entry: an
    # autostash (rebase, merge, pull), whose git meets this front too, runs them.
    stash_refusal="the stash is shared with the user's own checkout; to keep a change aside, copy the file or commit it on this branch"
    case "${rest[0]}" in
      list|show|create) ;;
      apply) [[ ${#rest[@]} -eq 2 && "${rest[1]}" =~ ^([0-9a-f]{40}|[0-9a-f]{64})$ ]] || refuse "$stash_refusal" ;;
      *) refuse "$stash_refusal" ;;
    esac ;;
  branch)
    # git takes a long option by any unambiguous start (--mo, --cop) and short ones bundled (-fm); -u's value follows it,
    # and --sort's is the next word (--sort -committerdate: a key, not options).
    sort_key=
    for arg in "${rest[@]}"; do
      [[ -n "$sort_key" ]] && { sort_key=; continue; }
      case "$arg" in
        --sort) sort_key=1; false ;;
        --*) [[ ( ${#arg} -ge 4 && "--move" == "$arg"* ) || ( ${#arg} -ge 5 && "--copy" == "$arg"* ) ]] ;;
        -*) letters=${arg#-}; [[ "${letters%%u*}" == *[mMcC]* ]] ;;
        *) false ;;
      esac && refuse "branches are shared with the user's checkout; this worktree works on its own branch only"
    done ;;
  reflog)
    # drop (git >= 2.50) deletes a ref's whole reflog, `drop refs/stash` every stash entry; write adds entries.
    case "${rest[0]}" in
      expire|delete|drop|write) refuse "the reflogs, the user's stash among them, are shared with the user's checkout" ;;
    esac ;;
  worktree)
    [[ "${rest[0]}" == list ]] ||
      refuse "worktrees are overnight's: another task's holds its work, and this one is where this task works" ;;
  gc|pack-refs|prune|repack|maintenance)
    refuse "housekeeping of the repository is the user's: it is shared with the user's checkout" ;;
  refs)
    # `git refs migrate` (git >= 2.46) moves every ref of the repository to another storage format.
    [[ "${rest[0]}" == migrate ]] &&
      refuse "housekeeping of the repository is the user's: it is shared with the user's checkout" ;;
  remote)
    # git remote runs no reference-transaction hook given through the environment: what it would
    # delete or move among the user's remote-tracking refs is refused here (after -v, its one option).
    sub=""
    for arg in "${rest[@]}"; do
      case "$arg" in -*) ;; *) sub=$arg; break ;; esac  # before it, only -v and its spellings
    done
    case "$sub" in
      prune|remove|rm|rename|set-head|update)
        refuse "the remote-tracking branches are shared with the user's checkout; git fetch (without --prune) is fine" ;;
    esac ;;
  symbolic-ref)
    # HEAD is this worktree's own; any other name is a ref the user's repository shares.
    names=(); deleting=; skip=; ended=
    for arg in "${rest[@]}"; do
      if [[ -n "$skip" ]]; then skip=; continue; fi
      if [[ -n "$ended" ]]; then names+=("$arg"); continue; fi
      case "$arg" in
        --) ended=1 ;;
        --*) [[ "--delete" == "$arg"* ]] && deleting=1 ;;  # git takes --del for --delete
        -*)
          letters=${arg#-}
          [[ "${letters%%m*}" == *d* ]] && deleting=1  # -d, or in a bundle (-qd) before any -m value
          [[ "$letters" == *m ]] && skip=1 ;;  # -m or -qm: its reason is the next word
        *) names+=("$arg") ;;
      esac
    done
    if [[ ${#names[@]} -ge 2 || -n "$deleting" ]] && [[ "${names[0]:-}" != HEAD ]]; then
      refuse "only HEAD of this worktree may be pointed elsewhere; ${names[0]:-that ref} is shared with the user's checkout"
    fi ;;
  fetch|pull)
    # Tags a remote has and the user has not would be new shared refs, which the hook refuses; and a
    # prune (asked for, or `fetch.prune` set) would delete the user's remote-tracking refs.
    if in_users_repository "${before[@]}"; then
      kept=(); options=1
      for arg in "${rest[@]}"; do
        if [[ -n "$options" ]]; then
          case "$arg" in
            --) options= ;;
            -p|--prune|-P|--prune-tags) continue ;;
            -[afkmnpPqtuv46]*)  # a cluster of flags (-pq): without its p and P
              if [[ "$arg" =~ ^-[afkmnpPqtuv46]+$ ]]; then
                arg=${arg//[pP]/}
                [[ "$arg" == - ]] && continue
              fi ;;
          esac
        fi
        kept+=("$arg")
      done
      exec REAL_GIT "${before[@]}" "$command" --no-tags --no-prune "${kept[@]}"
    fi ;;
esac
exec REAL_GIT "$@"
"""
