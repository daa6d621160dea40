#!/usr/bin/env bash
# Files a GPU run's raw record in the repository, here, after the run: scripts/gpu_record.sh DIR
# [--commit SHA], where DIR holds what scripts/gpu_check.sh left in $OUT on the GPU machine
# (summary.md and logs.tar.gz, as the device tool brought them back). Writes
# docs/gpu-runs/<YYYY-MM-DD>-<short commit>/ (-2, -3, ... when that exists already): summary.md and
# the stage logs, each with ANSI codes and progress bars' carriage returns dropped, and a log of more
# than 600 lines trimmed to its first 200 and last 400 with the cut marked. The date is the run's
# (summary.md's title); the commit is the one stamped by `gpu_check.sh --prepare` (summary.md's
# second line: Note [The commit stamp] in gpu_check.sh), since the GPU machine's .git is not the
# files that ran; --commit SHA names it where the summary has none. Refuses a record over 400 KB.
# Prints what it wrote; then `git add` the folder.
set -euo pipefail
usage="usage: scripts/gpu_record.sh DIR [--commit SHA]"
dir='' commit=''
while [[ $# -gt 0 ]]; do
  case "$1" in
    --commit)
      [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }
      commit=$2; shift 2 ;;
    -h | --help) echo "$usage"; exit 0 ;;
    -*) echo "gpu_record.sh: unknown option $1; $usage" >&2; exit 2 ;;
    *)
      [[ -z "$dir" ]] || { echo "gpu_record.sh: one folder only; $usage" >&2; exit 2; }
      dir=$1; shift ;;
  esac
done
[[ -n "$dir" ]] || { echo "$usage" >&2; exit 2; }
dir=$(cd "$dir" && pwd) || exit 2
cd "$(dirname "$0")/.."
summary=$dir/summary.md
[[ -f "$summary" ]] || { echo "gpu_record.sh: no summary.md in $dir" >&2; exit 1; }
limit_kb=400
keep_head=200 keep_tail=400

# The run's date: the title's ("# GPU check, 2026-11-28 10:12 UTC").
date=$(head -1 "$summary" | grep -oE '[0-9]{4}-[0-9]{2}-[0-9]{2}' | head -1 || true)
[[ -n "$date" ]] || { echo "gpu_record.sh: summary.md's first line names no date: $(head -1 "$summary")" >&2; exit 1; }
# The stamped commit: "commit <40 hex digits> (stamped at --prepare, ...); working tree ...".
stamped=$(grep -m1 -oE '^commit [0-9a-f]{40}' "$summary" | cut -c8- || true)
if [[ -n "$commit" ]]; then
  [[ "$commit" =~ ^[0-9a-f]{7,40}$ ]] || { echo "gpu_record.sh: --commit takes a hexadecimal commit id, not $commit" >&2; exit 2; }
  if [[ -n "$stamped" && "$stamped" != "$commit"* ]]; then
    echo "gpu_record.sh: note: --commit $commit overrides the stamp's $stamped" >&2
  fi
elif [[ -n "$stamped" ]]; then
  commit=$stamped
else
  echo "gpu_record.sh: summary.md names no stamped commit ($(grep -m1 '^commit' "$summary" || echo 'no commit line')):" \
    "pass --commit SHA, the commit whose files ran" >&2
  exit 1
fi
if git cat-file -e "$commit^{commit}" 2>/dev/null; then
  short=$(git rev-parse --short "$commit")
else
  short=${commit:0:7}
  echo "gpu_record.sh: note: commit $commit is not in this repository (not fetched yet?)" >&2
fi
if grep -q -m1 -E '^commit .*(DIFFERS from the stamp|had uncommitted changes)' "$summary"; then
  echo "gpu_record.sh: note: the files that ran were not exactly commit $short; summary.md's second line says how:" >&2
  grep -m1 '^commit ' "$summary" | cut -c1-400 >&2
fi

# Everything is made in a scratch folder first, and moved into docs/gpu-runs/ only if it fits.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/record" "$scratch/logs"
# clean: drops ANSI escape sequences, and keeps of each line what a terminal shows last (the text
# after its last carriage return: a progress bar's final state; a CRLF line keeps its text).
clean() { LC_ALL=C sed -E 's/\x1b\[[0-9;?]*[ -/]*[@-~]//g; s/\x1b[()][A-Za-z0-9]//g; s/\r+$//; s/.*\r//'; }
clean <"$summary" >"$scratch/record/summary.md"
declare -A trimmed_from=()
if [[ -f "$dir/logs.tar.gz" ]]; then
  # Only plain relative names (the check packs its log folder flat); nothing outside the folder.
  members=$(tar -tzf "$dir/logs.tar.gz") || { echo "gpu_record.sh: $dir/logs.tar.gz is not a readable tarball" >&2; exit 1; }
  while IFS= read -r m; do
    [[ -z "$m" || "$m" == ./ ]] && continue
    if [[ ! "$m" =~ ^(\./)?[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*/?$ || "$m" =~ (^|/)\.\.(/|$) ]]; then
      echo "gpu_record.sh: logs.tar.gz holds an unexpected name: $m" >&2
      exit 1
    fi
  done <<<"$members"
  tar -xzf "$dir/logs.tar.gz" -C "$scratch/logs" --no-same-owner --no-same-permissions
  while IFS= read -r -d '' f; do
    rel=${f#"$scratch/logs/"}
    [[ "$rel" == summary.md ]] && rel=logs-summary.md  # never over the summary
    mkdir -p "$(dirname "$scratch/record/$rel")"
    clean <"$f" >"$scratch/cleaned"
    lines=$(wc -l <"$scratch/cleaned")
    if ((lines > keep_head + keep_tail)); then
      {
        head -n "$keep_head" "$scratch/cleaned"
        echo "[... gpu_record.sh: lines $((keep_head + 1))-$((lines - keep_tail)) of $lines cut; the first $keep_head and the last $keep_tail kept ...]"
        tail -n "$keep_tail" "$scratch/cleaned"
      } >"$scratch/record/$rel"
      trimmed_from[$rel]=$lines
    else
      cp "$scratch/cleaned" "$scratch/record/$rel"
    fi
  done < <(find "$scratch/logs" -type f -print0 | sort -z)
else
  echo "gpu_record.sh: note: no logs.tar.gz in $dir; recording summary.md alone" >&2
fi

bytes=$(find "$scratch/record" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
if ((bytes > limit_kb * 1024)); then
  echo "gpu_record.sh: the record would be $((bytes / 1024)) KB, over the $limit_kb KB limit; its files:" >&2
  (cd "$scratch/record" && find . -type f -printf '%s\t%P\n' | sort -rn) >&2
  exit 1
fi

mkdir -p docs/gpu-runs
name=$date-$short
dest=docs/gpu-runs/$name
n=1
while [[ -e "$dest" ]]; do
  n=$((n + 1))
  dest=docs/gpu-runs/$name-$n
done
mkdir "$dest"
cp -R "$scratch/record/." "$dest/"
echo "gpu_record.sh: wrote $dest ($((bytes / 1024)) KB; run of $date, commit $short):"
(cd "$dest" && find . -type f -printf '%P\n' | sort) | while IFS= read -r rel; do
  printf '  %-24s %7s bytes %6s lines%s\n' "$rel" "$(stat -c %s "$dest/$rel")" "$(wc -l <"$dest/$rel")" \
    "${trimmed_from[$rel]:+  (trimmed from ${trimmed_from[$rel]} lines)}"
done
echo "next: git add $dest"
