"""What keeps the agent's own commands (`run_command`) off the user's things.

A task's worktree shares with the user's checkout every branch, tag, the stash and
the reflogs, and the repository's `.git/config`; the user's home holds the global
git config. A clumsy model's `git checkout main && git commit`, `git stash pop`,
`git tag -f`, `git push`, `git config user.email ...` or `npm install` (a husky
project sets `core.hooksPath`) would change them, and no rollback of the worktree
undoes that. The agent's commands therefore run with:

- git hooks of overnight's: `reference-transaction` refuses a change to any ref
  but the task's branch and the worktree's own (HEAD, bisect, rebase), so those
  commands fail with a line saying why (git >= 2.28); `pre-push` refuses every push
  (the morning's person decides what leaves the machine), and the front below refuses
  `push` too (`--no-verify` skips the hook) and any `-c core.hooksPath=...` or included
  file (in `GIT_CONFIG_PARAMETERS` too), and names overnight's settings, the hooks and the empty
  credential helper among them, again after a command's own `GIT_CONFIG_COUNT`;
- no credential helper: the user's stored tokens do not go with the agent's fetches;
- a front for git on PATH that refuses, before git runs, what changes shared
  things without a ref transaction the hook could refuse: `git stash` (but `list`
  and `show`: `stash pop` applies and drops the user's entry first), `git branch
  -m/-c` (git writes the copy without the hook), `git reflog expire/delete/drop/write`,
  `git worktree` (but `list`: `remove --force` deletes another task's work), and
  housekeeping (`gc`, `pack-refs`, `prune`, `maintenance`, `refs migrate`), each also as what an
  alias expands to (a shell alias: refused), and as what git itself runs (`rebase --exec`, `bisect
  run`, an editor: git's exec path, first on their PATH, is a folder whose git, and the dashed names of its
  builtins (git-stash), are the front); fetches without
  tags, which the hook would refuse, and without pruning (the hook refuses to delete
  a remote-tracking ref: it can be the user's last name for unmerged commits); and, outside the task's worktree (a `cd ..`
  that lands in the user's checkout or another task's worktree, or a GIT_DIR, --git-dir
  or GIT_INDEX_FILE naming their index), the commands
  that write an index or files (the ceilings of commands.git_ceilings already keep
  git from climbing out of the worktree into the user's checkout);
- a global git config of their own, which reads the user's but takes the writes;
- the repository's config put back once no agent command runs any more, if one
  changed it (`kept_config`);
- full-screen editors found first on PATH as programs that fail at once: with no
  terminal they would wait for keys until the command's time limit.

The hooks and the front act in the user's repository only: a repository the
agent makes or clones for its own use (a test suite's fixtures) works as usual.
The task's check and overnight's own git run without any of this.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from orchestrator.commands import WORKTREE_GIT_CONFIG, pid_alive
from orchestrator.files import replace_file

SCREEN_PROGRAMS = (
    "vi", "vim", "nvim", "view", "vimdiff", "nano", "pico", "emacs", "joe", "micro", "mcedit",
    # Debian's names for the same: the `editor` alternative and vim's builds.
    "editor", "sensible-editor", "vim.basic", "vim.tiny", "vim.nox", "rvim", "rview",
)
_SCREEN_REFUSAL = """#!/bin/sh
echo "overnight: ${0##*/} needs a terminal, and commands here have none; write files with the file tools instead" >&2
exit 1
"""
# Whether git's repository (GIT_DIR in a hook, or the one the arguments before the
# subcommand name) is the user's: a repository the agent made for itself is its own.
_SHARED = r"""
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
_REF_GUARD = "#!BASH" + _SHARED + r"""
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
_PUSH_REFUSAL = "#!BASH" + _SHARED + r"""
# From a clone of the agent's too, when it pushes into the user's repository ($2: where to): there receive-pack
# runs without the environment's settings, and a core.hooksPath of the repository's own (husky) beats overnight's.
if ! in_users_repository; then
  names_users_repository "$2" || exit 0
fi
echo "overnight: refused: nothing is pushed from an overnight worktree; a person reviews the branch in the morning" >&2
exit 1
"""
_GIT_FRONT = "#!BASH" + _SHARED + r"""
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
CONFIG_RESTORED = (
    "[overnight: this command changed the repository's git config, which the user's own checkout shares; "
    "overnight puts it back as it was. Commits here need no git settings.]"
)
BRANCH_VARIABLE = "OVERNIGHT_BRANCH"
COMMON_DIR_VARIABLE = "OVERNIGHT_COMMON_DIR"

_made: list[Path | None] = []  # the private folder, made once per process (again if it went)
_made_lock = threading.Lock()


@dataclass(frozen=True)
class Confinement:
    """Where one task's agent works: its branch (`overnight/<task>`) and the repository's shared config file;
    `config_copy`: where the config's bytes are kept while agent commands run (in the state dir), so that a
    night killed mid-command has it put back by the next night's recovery (restore_config_copy)."""

    branch: str
    shared_config: Path | None = None
    config_copy: Path | None = None


def _agent_git_settings() -> list[tuple[str, str]]:
    """The settings the agent's git gets through the environment, in order, but the fences' hooks: the worktrees'
    own, and no credential helper (an empty value empties git's list): the user's stored tokens stay theirs."""
    return [*WORKTREE_GIT_CONFIG.items(), ("credential.helper", "")]


def agent_environment(confinement: Confinement | None) -> dict[str, str]:
    """What to add to a command's environment (after WORKTREE_GIT_ENV) for the agent's own commands."""
    folder = _private_folder()
    if folder is None:  # nowhere it can run from (logged once): the commands run as the check does
        return {}
    env = {"PATH": os.pathsep.join(filter(None, (str(folder / "bin"), os.environ.get("PATH", os.defpath))))}
    env["GIT_CONFIG_GLOBAL"] = str(folder / "global-config")
    settings = _agent_git_settings()
    if confinement is not None:
        # Last, where they win; the git front names them all again after a command's own settings.
        settings.append(("core.hooksPath", str(folder / "hooks")))
        env[BRANCH_VARIABLE] = f"refs/heads/{confinement.branch}"
    env["GIT_CONFIG_COUNT"] = str(len(settings))
    for at, (key, value) in enumerate(settings):
        env[f"GIT_CONFIG_KEY_{at}"], env[f"GIT_CONFIG_VALUE_{at}"] = key, value
    if confinement is not None and confinement.shared_config is not None:
        env[COMMON_DIR_VARIABLE] = str(confinement.shared_config.parent)
        env["GIT_CONFIG_GLOBAL"] = str(_global_config_for(folder, confinement.shared_config.parent))
    return env


class kept_config:
    """A with-block around one agent command: the file at `path` is put back as it was when the first
    of the commands running at once began, once the last of them has ended (several tasks' commands
    overlap; each restoring its own "before" would put another's change back). `.restored` says
    whether this command changed it."""

    _lock = threading.Lock()
    _held: dict[str, list] = {}  # real path -> [commands running, bytes before the first]

    def __init__(self, path: Path | None, copy: Path | None = None) -> None:
        # The link's target: a `.git/config` that is a symlink stays one.
        self._path = os.path.realpath(path) if path is not None else None
        self._copy = copy
        self._own_before: bytes | None = None
        self.restored = False

    def __enter__(self) -> "kept_config":
        if self._path is None:
            return self
        with self._lock:
            self._own_before = _read(self._path)
            held = self._held.setdefault(self._path, [0, self._own_before])
            if held[0] == 0 and self._copy is not None and self._own_before is not None:
                _save_copy(self._copy, self._path, self._own_before)
            held[0] += 1
        return self

    def __exit__(self, *exc: object) -> None:
        if self._path is None:
            return
        with self._lock:
            held = self._held[self._path]
            held[0] -= 1
            now = _read(self._path)
            self.restored = now != self._own_before
            if held[0] == 0:
                del self._held[self._path]
                if now != held[1]:
                    _put_back(Path(self._path), held[1])
                if self._copy is not None:
                    self._copy.unlink(missing_ok=True)


# The copy's first line names the file it is a copy of; the file's bytes follow.
_COPY_HEADER = b"overnight: a copy of "


def _save_copy(copy: Path, path: str, before: bytes) -> None:
    """Whole or not at all, so that recovery never puts back half a config. Not synced (one write per
    agent command): what a killed process wrote survives it; a power loss may take the copy."""
    # Only the user may read it, as they may have made the config itself (it can hold a remote's token).
    replace_file(copy, _COPY_HEADER + os.fsencode(path) + b"\n" + before, mode=0o600, sync=False)


def restore_config_copy(copy: Path) -> str | None:
    """After a night killed while the agent's commands ran: the repository's config put back from the copy
    its first command kept, if a command changed it. The config's path when it was put back, else None."""
    try:
        saved = copy.read_bytes()
    except FileNotFoundError:
        return None
    header, _, before = saved.partition(b"\n")
    restored = None
    if header.startswith(_COPY_HEADER):
        path = os.fsdecode(header[len(_COPY_HEADER):])
        if _read(path) != before:
            _put_back(Path(path), before)
            restored = path
    copy.unlink(missing_ok=True)
    return restored


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _put_back(path: Path, before: bytes | None) -> None:
    if before is None:
        path.unlink(missing_ok=True)
        return
    # Whole or not at all: git reads this file in every process, the user's too. With the mode and
    # owner it has: a config only its owner may read (it can hold a token) stays so.
    try:
        now = os.stat(path)
        mode, owner = stat.S_IMODE(now.st_mode), (now.st_uid, now.st_gid)
    except FileNotFoundError:
        mode, owner = None, None
    replace_file(path, before, mode=mode, owner=owner, sync=False)


def _private_folder() -> Path | None:
    """bin/ (the git front, refusing editors), hooks/, global-config: made once per process where
    programs may run, made again if removed meanwhile (a tmp cleaner), removed when the process ends."""
    with _made_lock:
        if _made and (_made[0] is None or _made[0].is_dir()):
            return _made[0]
        _made[:] = [_make_private_folder()]
        return _made[0]


def _make_private_folder() -> Path | None:
    bash, git = shutil.which("bash"), shutil.which("git")
    # /tmp may be mounted noexec (a common hardening): then a folder in the user's cache.
    for base in (None, *user_cache_folders("overnight")):
        folder: Path | None = None
        try:
            if base is not None:
                base.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix=_FOLDER_PREFIX, dir=base))
            # Whose it is: removed at exit, or, after a kill -9, by the next night (remove_abandoned_folders).
            (folder / "pid").write_text(str(os.getpid()))
            _fill(folder, bash, git)
            if os.access(folder / "bin" / SCREEN_PROGRAMS[0], os.X_OK):
                atexit.register(_remove, folder)
                return folder
        except OSError:
            pass
        if folder is not None:
            _remove(folder)
    from orchestrator.logs import get_logger

    get_logger().warning("agent_fences_unavailable", reason="no folder where programs may run (tmp and ~/.cache noexec or full)")
    return None


_FOLDER_PREFIX = "overnight-agent-"


def remove_abandoned_folders() -> list[Path]:
    """The private folders of overnight processes that died without their exit handlers (kill -9,
    the OOM killer): one a night would otherwise pile up in /tmp, read-only parts and all."""
    removed = []
    for base in (Path(tempfile.gettempdir()), *user_cache_folders("overnight")):
        for folder in base.glob(f"{_FOLDER_PREFIX}*"):
            try:
                pid = int((folder / "pid").read_text())
            except (OSError, ValueError):
                continue  # not one with an owner to ask (an older version's, another's): left alone
            if pid != os.getpid() and not pid_alive(pid):
                _remove(folder)
                removed.append(folder)
    return removed


def user_cache_folders(name: str) -> list[Path]:
    """`<XDG cache or ~/.cache>/<name>`, or none when there is no home to find: HOME unset and no
    passwd entry, as in a container run under an arbitrary uid (Path.home() raises then)."""
    if os.environ.get("XDG_CACHE_HOME"):
        return [Path(os.environ["XDG_CACHE_HOME"]) / name]
    try:
        return [Path.home() / ".cache" / name]
    except (RuntimeError, KeyError):
        return []


# Git reads the settings the fences rely on from the environment (GIT_CONFIG_COUNT: 2.31,
# GIT_CONFIG_GLOBAL: 2.32) and ignores them before that, silently.
FENCES_NEED_GIT = (2, 32)


def _fill(folder: Path, bash: str | None, git: str | None) -> None:
    for name in SCREEN_PROGRAMS:
        _write_program(folder / "bin" / name, _SCREEN_REFUSAL)
    missing = fences_missing(bash, git)
    if missing:
        from orchestrator.logs import get_logger

        get_logger().warning("agent_fences_unavailable", reason=missing)
    if bash and git:
        own_commands = " ".join(_own_commands(git))
        settings = [word for setting in _agent_git_settings() for word in setting]
        own_repository_settings = [word for key, value in _agent_git_settings() if key != "core.hooksPath" for word in (key, value)]

        def program(text: str) -> str:
            text = text.replace("FENCE_HOOKS", _quoted(str(folder / "hooks"))).replace("GIT_OWN_COMMANDS", own_commands)
            text = text.replace("FENCE_OWN_REPOSITORY_SETTINGS", _quoted_words(own_repository_settings))
            text = text.replace("FENCE_SETTINGS", _quoted_words(settings))
            return text.replace("BASH", bash, 1).replace("REAL_GIT", _quoted(git))

        gits_exec_path = _link_exec_path(folder / "exec", git, folder / "bin" / "git")
        front = program(_GIT_FRONT).replace("FENCE_GITS_EXEC_PATH", _quoted(gits_exec_path or ""))
        _write_program(folder / "bin" / "git", front.replace("FENCE_EXEC_PATH", _quoted(str(folder / "exec") if gits_exec_path else "")))
        _write_program(folder / "hooks" / "reference-transaction", program(_REF_GUARD))
        _write_program(folder / "hooks" / "pre-push", program(_PUSH_REFUSAL))
    # git drops GIT_CONFIG_COUNT for the git it starts in another repository (local_repo_env): a push
    # from a clone the agent made into the user's repository runs receive-pack there with the hooks
    # this file names (a repository's own core.hooksPath still wins).
    if bash and git:
        (folder / "hooks-config").write_text(f'[core]\n\thooksPath = {_config_quoted(str(folder / "hooks"))}\n')
    (folder / "global-config").write_text(_including(_users_global_configs()))
    # Read-only: a hook installer run by the agent (`git rev-parse --git-path hooks` names this folder) cannot replace them.
    for sub in ("bin", "hooks", "exec"):
        if (folder / sub).is_dir():
            (folder / sub).chmod(0o555)


# git's commands that a model runs most, for a git that cannot list its own (an alias of one of them is never run).
_COMMON_GIT_COMMANDS = (
    "add", "blame", "branch", "checkout", "cherry-pick", "clone", "commit", "config", "diff", "fetch", "grep", "init",
    "log", "ls-files", "merge", "mv", "pull", "push", "rebase", "reset", "restore", "rev-parse", "rm", "show", "stash",
    "status", "switch", "tag",
)


def _own_commands(git: str) -> list[str]:
    """The names of `git`'s builtins and of the programs in its exec path, which git runs before an alias of the same name."""
    try:
        listed = subprocess.run([git, "--list-cmds=builtins,main"], capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = []
    # Names only: they go into the front's text.
    names = [name for name in listed if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name)]
    return names or list(_COMMON_GIT_COMMANDS)


def _link_exec_path(folder: Path, git: str, front: Path) -> str | None:
    """`folder` made a copy of `git`'s exec path in links, but for its `git` and the dashed names of its builtins
    (git-stash), which lead to the `front`. The exec path it copies, or None when it could not."""
    try:
        real = subprocess.run([git, "--exec-path"], capture_output=True, text=True, timeout=30).stdout.strip()
        names = os.listdir(real) if real else []
    except (OSError, subprocess.SubprocessError):
        return None
    if "git" not in names:  # what git runs finds the front on PATH then, after git's folder
        return None
    builtins = _builtins(git)
    try:
        folder.mkdir()
        for name in names:
            (folder / name).symlink_to(front if _runs_as_git(name, builtins) else Path(real) / name)
    except OSError:  # a file system without links: the front as before, a shell's git past it
        return None
    return real


def _builtins(git: str) -> set[str]:
    """The commands `git` runs in its own process (none when it cannot list them)."""
    try:
        return set(subprocess.run([git, "--list-cmds=builtins"], capture_output=True, text=True, timeout=30).stdout.split())
    except (OSError, subprocess.SubprocessError):
        return set()


def _runs_as_git(name: str, builtins: set[str]) -> bool:
    """Whether the program `name` of git's exec path is git itself: `git`, or a builtin's dashed name (git-stash), git
    run under another name as `git stash`. Only a builtin's: `git bisect` of a git whose bisect is the script git-bisect
    runs that script, which, led to the front, would run the front again, and again."""
    return name == "git" or (name.startswith("git-") and name[len("git-"):] in builtins)


def fences_missing(bash: str | None, git: str | None) -> str:
    """Why the git fences cannot keep the agent's commands off the user's repository ("" when they can)."""
    if not git:
        return "no git on PATH"
    if not bash:
        return "no bash on PATH: the git front and hooks are bash scripts"
    try:
        said = subprocess.run([git, "version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    found = re.search(r"(\d+)\.(\d+)", said)
    if found and (int(found.group(1)), int(found.group(2))) < FENCES_NEED_GIT:
        wanted = ".".join(map(str, FENCES_NEED_GIT))
        return f"git {found.group(0)} is older than {wanted}, which reads the fences' settings from the environment: upgrade git"
    return ""


def _remove(folder: Path) -> None:
    for sub in ("bin", "hooks", "exec"):
        try:
            (folder / sub).chmod(0o755)
        except OSError:
            pass
    shutil.rmtree(folder, ignore_errors=True)


def _write_program(path: Path, text: str) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    path.chmod(0o555)


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _quoted_words(words: list[str]) -> str:
    return " ".join(map(_quoted, words))


def _users_global_configs() -> list[str]:
    """The files git reads as the user's global config, in git's order (the later wins)."""
    if os.environ.get("GIT_CONFIG_GLOBAL"):
        return [os.environ["GIT_CONFIG_GLOBAL"]]
    home = os.environ.get("HOME")
    xdg = os.environ.get("XDG_CONFIG_HOME") or (os.path.join(home, ".config") if home else "")
    found = [os.path.join(xdg, "git", "config")] if xdg else []
    return found + ([os.path.join(home, ".gitconfig")] if home else [])


def _global_config_for(folder: Path, common: Path) -> Path:
    """The private global config, and overnight's hooks for the user's repository only: git drops
    GIT_CONFIG_COUNT for the git it starts in another repository (local_repo_env), so a push from a
    clone of the agent's into the user's repository runs receive-pack there with these; a test
    suite's fixture repository keeps its own (a pre-receive hook under test)."""
    import hashlib

    path = folder / f"global-config-{hashlib.sha1(os.fsencode(common)).hexdigest()[:16]}"
    if not path.exists() and (folder / "hooks-config").exists():
        patterns = dict.fromkeys(_GLOB_SPECIAL.sub(r"\\\g<0>", place) for place in (os.path.abspath(common), os.path.realpath(common)))
        hooks = _config_quoted(str(folder / "hooks-config"))
        conditions = "".join(f"[includeIf {_config_quoted(f'gitdir:{pattern}/')}]\n\tpath = {hooks}\n" for pattern in patterns)
        replace_file(path, (_including([str(folder / "global-config")]) + conditions).encode(), sync=False)
    return path if path.exists() else folder / "global-config"


_GLOB_SPECIAL = re.compile(r"[*?\[\\]")


def _config_quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _including(paths: list[str]) -> str:
    """A git config that reads `paths` (absent ones are skipped by git) and holds nothing itself."""
    return "[include]\n" + "".join(f"\tpath = {_config_quoted(path)}\n" for path in paths)
