#!/bin/bash
# A restructuring's check (issue 59), beside metrics_identity.sh: what a trained model says must not
# change. The code of COMMIT and the working tree each train a GPT (shakespeare-char-cpu) and the
# translation model (multi30k-de-en) 20 steps on the same seeds (PyTorch's path, one thread); then
# each side's code, on its own runs, writes greedy samples, beam hypotheses and the server's
# completions, each on the fused decoding step and on PyTorch's. Every output must be identical
# text for text (the replies' ids and times aside). Only flags that both sides accept are used.
#   bash scripts/outputs_identity.sh COMMIT [DATA_ROOT]     (DATA_ROOT: default ../shared/data)
set -e
COMMIT=${1:?usage: scripts/outputs_identity.sh COMMIT [DATA_ROOT]}
DATA=$(realpath "${2:-../shared/data}")
ROOT=$(git rev-parse --show-toplevel)
PY=$ROOT/.venv/bin/python
WORK=$(mktemp -d)
export OMP_NUM_THREADS=1
git -C "$ROOT" worktree add --quiet -f "$WORK/before" "$COMMIT"
SERVER=
trap '[ -n "$SERVER" ] && kill "$SERVER"; git -C "$ROOT" worktree remove --force "$WORK/before"' EXIT

attnlab() {  # log file, source folder, then attnlab's arguments; on failure the log's end, and stop
  local log=$1 src=$2; shift 2
  (cd "$WORK" && PYTHONPATH=$src "$PY" -m attnlab "$@" >"$log.out" 2>"$log.err") && return
  echo "failed: attnlab $*"; tail -20 "$log.err"; exit 1
}

serve() {  # out file, source folder, run, path: /v1/completions' replies of that side's server
  local out=$1 src=$2 run=$3 path=$4 port
  port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  (cd "$WORK" && PYTHONPATH=$src exec "$PY" -m attnlab serve "$run" --port "$port" --threads 1 --device cpu \
    "--$path" >"$out.log" 2>&1) &
  SERVER=$!
  "$PY" - "$port" "$SERVER" >"$out" <<'PY' || { echo "failed: attnlab serve --$path"; tail -20 "$out.log"; exit 1; }
import json, os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
base = f"http://127.0.0.1:{port}"
def get(url):
    return json.load(urllib.request.urlopen(url, timeout=600))
for _ in range(1200):  # loading, and on the fused path perhaps building the step first
    try:
        model = get(f"{base}/v1/models")["data"][0]["id"]
        break
    except OSError:
        with open(f"/proc/{pid}/stat") as f:  # a server that died (a zombie till reaped): the log says why
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                sys.exit("the server stopped")
        time.sleep(0.5)
def post(body):
    body = {"model": model, "temperature": 0, "max_tokens": 40, **body}
    request = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        raw = reply.read().decode()
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    return [{k: v for k, v in e.items() if k not in ("id", "created")} for e in events or [json.loads(raw)]]
for body in (
    {"prompt": ["ROMEO:", "JULIET:", "First Citizen:\n"]},
    {"prompt": "ROMEO:", "logprobs": 5},
    {"prompt": "KING RICHARD III:\nNow is", "echo": True, "logprobs": 2},
    {"prompt": "MENENIUS:", "stream": True},
):
    print(json.dumps({"request": body, "replies": post(body)}, sort_keys=True))
PY
  kill "$SERVER"; wait "$SERVER" || true; SERVER=
}

zcat "$DATA/multi30k/test_2016_flickr.de.gz" | head -6 >"$WORK/sentences.de"
printf '%s\n' "Ein Mann fährt Fahrrad." "Zwei Hunde spielen im Schnee." >>"$WORK/sentences.de"
train=(--set train.fused_kernels=false --set train.max_iters=20 --set train.eval_interval=10 --set train.eval_iters=2)
for side in "before:$WORK/before/src" "after:$ROOT/src"; do
  name=${side%%:*}; src=${side#*:}; runs=$WORK/runs-$name; out=$WORK/out-$name
  mkdir -p "$out"
  attnlab "$out/train-gpt" "$src" train shakespeare-char-cpu "${train[@]}" --out "$runs/gpt"
  attnlab "$out/train-mt" "$src" train multi30k-de-en --data-dir "$DATA/multi30k" "${train[@]}" --out "$runs/mt"
  for path in no-fused fused; do
    attnlab "$out/sample-$path" "$src" sample "$runs/gpt" -p "ROMEO:" -n 100 --temperature 0 --device cpu --json "--$path"
    attnlab "$out/beam-$path" "$src" translate "$runs/mt" --input "$WORK/sentences.de" --beam 4 --device cpu --json \
      "--$path"
    serve "$out/serve-$path.jsonl" "$src" "$runs/gpt" "$path"
  done
done
status=0
for check in sample-no-fused.out sample-fused.out beam-no-fused.out beam-fused.out serve-no-fused.jsonl serve-fused.jsonl; do
  if [ ! -s "$WORK/out-after/$check" ]; then
    echo "${check%.*}: DIFFERENT (no output)"; status=1
  elif cmp -s "$WORK/out-before/$check" "$WORK/out-after/$check"; then
    echo "${check%.*}: identical"
  else
    echo "${check%.*}: DIFFERENT"; diff "$WORK/out-before/$check" "$WORK/out-after/$check" | head -20; status=1
  fi
done
exit $status
