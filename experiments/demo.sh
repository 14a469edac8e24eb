#!/usr/bin/env bash
# `make demo`: small UNet3D data, then four traced runs on it:
#   1. instrumented: the real model, each step timed phase by phase;
#   2. a sleep profile fitted to that run, on this host (./cli.py profile fit);
#   3. original: real training, as a user runs it;
#   4. sleep with the fitted profile: the emulated accelerator, so the similarity printed is
#      the emulator's fidelity on this host, not a difference of hardware;
#   5. sleep emulating an NVIDIA A100 (profile database): what the storage would have to
#      deliver to keep that card busy.
# Caches are dropped before each run. Each run prints its summary (for 1, 4 and 5: the step
# time split, AU, and the data rate read vs needed); then the similarity report and timelines.
set -euo pipefail
PY=${PY:-.venv/bin/python}
DATA=${DEMO_DATA:-data/unet3d-demo}
RUNS=${DEMO_RUNS:-runs}
COMMON=(--workload unet3d --data "$DATA" --epochs 1 --batch-size 2 --workers 2 --out "$RUNS")

say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
traced() {  # traced VARIANT [ARGS...]: one traced run on dropped caches; prints its directory
  sync
  echo 3 >/proc/sys/vm/drop_caches
  "$PY" cli.py trace "${COMMON[@]}" --variant "$@" | tail -n 1
}

if [ ! -f "$DATA/manifest.json" ]; then
  say "generating the demo dataset ($DATA)"
  "$PY" cli.py datagen unet3d --out "$DATA" --size 300MB --scale 0.5 --force
fi

say "1/5 instrumented run: the real model, timed phase by phase"
inst=$(traced instrumented)
say "2/5 a sleep profile fitted to it on this host"
profile="$RUNS/profiles/$(basename "$inst")-fitted.json"
"$PY" cli.py profile fit "$inst" --out "$profile" >/dev/null
say "3/5 original run: real training"
orig=$(traced original)
say "4/5 sleep run: the emulated accelerator, with the profile of step 2"
emulated=$(traced sleep --profile "$profile")
say "how closely the emulated run matches the real one"
"$PY" cli.py plot timeline "$orig" "$emulated" --out "$emulated/timeline-original-vs-sleep.html" >/dev/null
"$PY" cli.py compare "$orig" "$emulated"
say "5/5 sleep run emulating an NVIDIA A100 (profile database): what the storage must deliver"
a100=$(traced sleep --accelerator a100)
say "timelines"
"$PY" cli.py plot timeline "$orig"
"$PY" cli.py plot timeline "$emulated"
"$PY" cli.py plot timeline "$a100"
