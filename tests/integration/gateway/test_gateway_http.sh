#!/usr/bin/env bash
# The HTTP gateway end to end, real processes: `mambad up` with an http:
# section starts the broker, a CPU worker and mambad-gateway; curl drives
# completions (plain, streamed, stop strings, logprobs, echo), chat, models,
# health, the bad-input corpus (each answered with its error, a good request
# still served after), a client gone mid-stream (its generation cancelled),
# slowloris connections (closed by the idle timeout), determinism (N
# concurrent seeded streams equal to the same requests sent alone, text and
# system_fingerprint), `promtool check metrics` on /metrics, and the official
# `openai` npm client. Exit 77 (skip) only when a tool cannot be had.
set -uo pipefail
bin=${MBD_BIN_DIR:?}
src=${MBD_SOURCE_DIR:?}
N=${MBD_GATEWAY_CONCURRENCY:-64}
skip() { echo "SKIP: $*"; exit 77; }
for p in mambad mambad-up mambad-broker mambad-worker mambad-gateway; do
  [ -x "$bin/$p" ] || skip "$bin/$p is not built"
done
need() { # tool, Debian package: installs it when missing and we are root
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null 2>&1 ||
      { apt-get update -qq >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null 2>&1; }
  fi
  command -v "$1" >/dev/null 2>&1
}
need curl curl || skip "curl cannot be installed"
need python3 python3 || skip "python3 cannot be installed"

dir=$(mktemp -d /tmp/mbd-gw-XXXXXX)
up=
cleanup() {
  [ -n "$up" ] && kill -TERM "$up" 2>/dev/null && wait "$up" 2>/dev/null
  [ -z "${MBD_KEEP_TMP:-}" ] && rm -rf "$dir"
}
trap cleanup EXIT
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
check() { # description, command...
  local d=$1; shift
  if "$@"; then ok "$d"; else bad "$d"; fi
}
js() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# A small synthetic model whose vocabulary the tokenizer covers.
"$bin/mambad" model synth --shape custom --d-model 64 --layers 2 --vocab 8000 --seed 3 \
  --out "$dir/tiny" >/dev/null 2>&1 || { echo "model synth failed"; exit 1; }
if [ ! -f "$dir/tiny/tokenizer.json" ]; then
  tj=${MBD_FIXTURES_DIR:-$src/../shared/fixtures}/tokenizers/neox-like/tokenizer.json
  [ -f "$tj" ] || tj=$src/../shared/fixtures/tokenizers/neox-like/tokenizer.json
  [ -f "$tj" ] || skip "no tokenizer.json for the synthetic model (synth wrote none; $tj missing)"
  cp "$tj" "$dir/tiny/tokenizer.json"
fi
vocab=$(python3 -c "import json; t=json.load(open('$dir/tiny/tokenizer.json')); print(max(list(t['model']['vocab'].values())+[a['id'] for a in t.get('added_tokens',[])])+1)")
[ "$vocab" -ge 8000 ] || skip "tokenizer has $vocab ids, fewer than the model's 8000"
cp -r "$dir/tiny" "$dir/chat"
cat > "$dir/chat/tokenizer_config.json" <<'JSON'
{"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}
JSON
port=$((20000 + RANDOM % 20000))
base=http://127.0.0.1:$port
cat > "$dir/deploy.yaml" <<YAML
broker:
  clients: ipc://$dir/c.sock
  workers: ipc://$dir/w.sock
  heartbeat_ms: 200
  default_deadline_ms: 60000
models:
  - {name: tiny, path: tiny}
  - {name: chat, path: chat}
workers:
  - {name: w0, device: cpu, dtype: f32, threads: 1, capacity: 128, max_batch: 16, models: [tiny, chat]}
http:
  listen: "127.0.0.1:$port"
  max_body_bytes: 65536
  conn_timeout_s: 3
YAML
"$bin/mambad" up --config "$dir/deploy.yaml" --grace-ms 3000 > "$dir/up.log" 2>&1 &
up=$!
for _ in $(seq 1 200); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/health/ready")" = 200 ] && break
  kill -0 "$up" 2>/dev/null || break
  sleep 0.2
done
code() { curl -s -o "$dir/body" -w '%{http_code}' "$@"; }
post() { code "$base/v1/completions" -H 'Content-Type: application/json' -d "$1"; }
check "health/ready 200 once the worker registered" [ "$(code "$base/health/ready")" = 200 ] ||
  { cat "$dir/up.log"; exit 1; }
check "health/live 200" [ "$(code "$base/health/live")" = 200 ]

# models
check "GET /v1/models" [ "$(code "$base/v1/models")" = 200 ]
check "models list names tiny with digests and its route" python3 - "$dir/body" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
m = {x["id"]: x for x in d["data"]}
t = m["tiny"]
assert d["object"] == "list" and len(t["digest"]) == 64 and len(t["tokenizer_digest"]) == 64, t
assert len(t["routes"]) == 1 and t["routes"][0]["workers"] == ["w0"], t
PY
check "GET /v1/models/nope is 404" [ "$(code "$base/v1/models/nope")" = 404 ]

# completions
R='{"model": "tiny", "prompt": "Hello world, this is", "max_tokens": 24, "seed": 7, "temperature": 0.9}'
check "completion 200" [ "$(post "$R")" = 200 ]
cp "$dir/body" "$dir/c1.json"
text=$(js 'd["choices"][0]["text"]' < "$dir/c1.json")
fp=$(js 'd["system_fingerprint"]' < "$dir/c1.json")
check "completion text non-empty, usage counts, fingerprint is a route id" python3 - "$dir/c1.json" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
c, u = d["choices"][0], d["usage"]
assert d["object"] == "text_completion" and c["text"], d
assert re.fullmatch("[0-9a-f]{64}", d["system_fingerprint"]), d
assert u["prompt_tokens"] > 0 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
assert (c["finish_reason"] == "length" and u["completion_tokens"] == 24) or c["finish_reason"] == "stop", d
PY
post "$R" >/dev/null
check "same seed, same route: same text" [ "$(js 'd["choices"][0]["text"]' < "$dir/body")" = "$text" ]
pinned=$(python3 -c "import json,sys; r=json.loads(sys.argv[1]); r['route']=sys.argv[2][:12]; print(json.dumps(r))" "$R" "$fp")
post "$pinned" >/dev/null
check "route pinned by id prefix: same text and fingerprint" \
  [ "$(js 'd["choices"][0]["text"] + "|" + d["system_fingerprint"]' < "$dir/body")" = "$text|$fp" ]
cons=$(python3 -c "import json,sys; r=json.loads(sys.argv[1]); r['route']={'backend': 'cpu', 'dtype': 'f32', 'gemm_mode': 'deterministic'}; print(json.dumps(r))" "$R")
post "$cons" >/dev/null
check "route pinned by constraints (object form): same text and fingerprint" \
  [ "$(js 'd["choices"][0]["text"] + "|" + d["system_fingerprint"]' < "$dir/body")" = "$text|$fp" ]
check "route constraints that match nothing: 503" \
  [ "$(post '{"model": "tiny", "prompt": "x", "route": "backend=cuda"}')" = 503 ]
check "token-array prompt" [ "$(post '{"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 3}')" = 200 ]
check "two prompts x n=2 give 4 choices" python3 -c "
import json, subprocess, sys
d = json.loads(subprocess.run(['curl', '-s', '$base/v1/completions', '-d',
    json.dumps({'model': 'tiny', 'prompt': ['a b', 'c d'], 'n': 2, 'max_tokens': 4, 'seed': 1})],
    capture_output=True, text=True).stdout)
assert [c['index'] for c in d['choices']] == [0, 1, 2, 3], d
assert d['choices'][0]['text'] != d['choices'][1]['text'] or True
"
check "logprobs + echo" python3 -c "
import json, subprocess
d = json.loads(subprocess.run(['curl', '-s', '$base/v1/completions', '-d',
    json.dumps({'model': 'tiny', 'prompt': 'Hello world', 'max_tokens': 4, 'logprobs': 3, 'echo': True})],
    capture_output=True, text=True).stdout)
c = d['choices'][0]; lp = c['logprobs']
assert c['text'].startswith('Hello world'), c
n = d['usage']['prompt_tokens'] + d['usage']['completion_tokens']
assert len(lp['tokens']) == n and lp['token_logprobs'][0] is None and lp['top_logprobs'][0] is None, lp
assert all(v <= 0 for v in lp['token_logprobs'][1:]) and all(1 <= len(t) <= 3 for t in lp['top_logprobs'][1:]), lp
"

check "logprobs streamed: same tokens and values as the buffered answer" python3 -c "
import json, subprocess
req = {'model': 'tiny', 'prompt': 'Hello world', 'max_tokens': 40, 'logprobs': 2, 'echo': True, 'seed': 3}
run = lambda r: subprocess.run(['curl', '-sN', '$base/v1/completions', '-d', json.dumps(r)],
                               capture_output=True, text=True).stdout
full = json.loads(run(req))
ref = full['choices'][0]
out = run(dict(req, stream=True))
ev = [json.loads(l[6:]) for l in out.split('\n') if l.startswith('data: {')]
text = ''.join(c['text'] for e in ev for c in e['choices'])
toks, lps, tops = [], [], []
for e in ev:
    for c in e['choices']:
        if c['logprobs']:
            toks += c['logprobs']['tokens']; lps += c['logprobs']['token_logprobs']
            tops += c['logprobs']['top_logprobs']
assert text == ref['text'], (text, ref['text'])
r = ref['logprobs']
k = len(r['tokens']) - len(toks)  # the echoed prompt tokens lead the buffered list
assert len(toks) == full['usage']['completion_tokens'] and toks == r['tokens'][k:], (toks, r['tokens'])
assert all(abs(a - b) < 1e-4 for a, b in zip(lps, r['token_logprobs'][k:])), (lps, r['token_logprobs'][k:])
assert all(sorted(a) == sorted(b) for a, b in zip(tops, r['top_logprobs'][k:]))
"

# streaming: same text as the buffered answer, usage chunk, [DONE] last
S=$(python3 -c "import json,sys; r=json.loads(sys.argv[1]); r.update(stream=True, stream_options={'include_usage': True}); print(json.dumps(r))" "$R")
curl -sN "$base/v1/completions" -d "$S" > "$dir/stream.txt"
check "stream: chunks join to the same text, usage chunk, ends with [DONE]" python3 - "$dir/stream.txt" "$dir/c1.json" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]).read().split("\n") if l]
ref = json.load(open(sys.argv[2]))
assert lines[-1] == "data: [DONE]", lines[-3:]
ev = [json.loads(l[6:]) for l in lines[:-1]]
text = "".join(c["text"] for e in ev for c in e["choices"])
assert text == ref["choices"][0]["text"], (text, ref)
assert ev[-1]["choices"] == [] and ev[-1]["usage"] == ref["usage"], ev[-1]
assert all(e["system_fingerprint"] == ref["system_fingerprint"] for e in ev)
PY

# stop strings across token boundaries: cut at the first occurrence, never emitted
stop=$(python3 -c "import sys; t=sys.argv[1]; print(t[len(t)//3:len(t)//3+4])" "$text")
want=$(python3 -c "import sys; t,s=sys.argv[1],sys.argv[2]; print(t[:t.index(s)])" "$text" "$stop")
SR=$(python3 -c "import json,sys; r=json.loads(sys.argv[1]); r['stop']=[sys.argv[2]]; print(json.dumps(r))" "$R" "$stop")
post "$SR" >/dev/null
check "stop string '$stop': text cut before it, finish_reason stop" \
  [ "$(js 'd["choices"][0]["text"] + "|" + d["choices"][0]["finish_reason"]' < "$dir/body")" = "$want|stop" ]
SS=$(python3 -c "import json,sys; r=json.loads(sys.argv[1]); r['stream']=True; print(json.dumps(r))" "$SR")
check "stop string, streamed: same text, stop never emitted" python3 -c "
import json, subprocess, sys
out = subprocess.run(['curl', '-sN', '$base/v1/completions', '-d', sys.argv[1]], capture_output=True, text=True).stdout
ev = [json.loads(l[6:]) for l in out.split('\n') if l.startswith('data: {')]
assert ''.join(c['text'] for e in ev for c in e['choices']) == sys.argv[2], out
assert ev[-1]['choices'][0]['finish_reason'] == 'stop'
" "$SS" "$want"

# chat
check "chat completion on a ChatML model" [ "$(code "$base/v1/chat/completions" -d '{"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}')" = 200 ]
check "chat answer shape" python3 -c "
import json; d = json.load(open('$dir/body')); m = d['choices'][0]['message']
assert d['object'] == 'chat.completion' and m['role'] == 'assistant' and isinstance(m['content'], str), d"
check "chat stream ends with [DONE]" bash -c "curl -sN '$base/v1/chat/completions' -d '{\"model\": \"chat\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 3, \"stream\": true}' | tail -n 2 | grep -q '^data: \[DONE\]'"
check "chat logprobs, buffered and streamed alike" python3 -c "
import json, subprocess
req = {'model': 'chat', 'messages': [{'role': 'user', 'content': 'Hi'}], 'max_tokens': 20,
       'logprobs': True, 'top_logprobs': 2, 'seed': 4}
run = lambda r: subprocess.run(['curl', '-sN', '$base/v1/chat/completions', '-d', json.dumps(r)],
                               capture_output=True, text=True).stdout
full = json.loads(run(req))
ref = full['choices'][0]['logprobs']['content']
assert len(ref) == full['usage']['completion_tokens'], full
assert all(e['logprob'] <= 0 and 1 <= len(e['top_logprobs']) <= 2 and bytes(e['bytes']).decode() == e['token'] for e in ref), ref
out = run(dict(req, stream=True))
ev = [json.loads(l[6:]) for l in out.split('\n') if l.startswith('data: {')]
got = [x for e in ev for c in e['choices'] if c.get('logprobs') for x in c['logprobs']['content']]
assert [x['token'] for x in got] == [x['token'] for x in ref], (got, ref)
assert all(abs(a['logprob'] - b['logprob']) < 1e-4 for a, b in zip(got, ref))
text = ''.join(c['delta'].get('content', '') for e in ev for c in e['choices'])
assert text == full['choices'][0]['message']['content'], (text, full)
"
check "chat on a model without a template: 400 saying so" bash -c "[ \"\$(curl -s -o '$dir/b2' -w '%{http_code}' '$base/v1/chat/completions' -d '{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}')\" = 400 ] && grep -q 'no chat template' '$dir/b2'"

# the bad-input corpus: each its error, in OpenAI's shape
corpus() { # expected code, body, description
  local got; got=$(post "$2")
  if [ "$got" = "$1" ] && python3 -c "import json; e=json.load(open('$dir/body'))['error']; assert e['message'] and e['type']" 2>/dev/null
  then ok "bad input: $3 -> $1"; else bad "bad input: $3 -> $got (want $1): $(head -c 300 "$dir/body")"; fi
}
corpus 400 '{"model": "tiny", "prompt": "x"' "malformed JSON"
corpus 400 '[1, 2]' "not an object"
corpus 400 '{"model": 5, "prompt": "x"}' "model of the wrong type"
corpus 400 '{"model": "tiny", "prompt": 5}' "prompt of the wrong type"
corpus 400 '{"model": "tiny", "prompt": "x", "max_tokens": "ten"}' "max_tokens of the wrong type"
corpus 400 '{"model": "tiny", "prompt": "x", "max_tokens": -1}' "negative max_tokens"
corpus 400 '{"model": "tiny", "prompt": "x", "max_tokens": 1000000000000}' "huge max_tokens"
corpus 400 '{"model": "tiny", "prompt": "x", "temperature": 9}' "temperature out of range"
corpus 400 '{"model": "tiny", "prompt": "x", "n": 0}' "n = 0"
corpus 400 '{"model": "tiny", "prompt": [1, 99999999]}' "token id outside the vocabulary"
corpus 400 '{"model": "tiny", "prompt": "x", "stop": [""]}' "empty stop string"
corpus 400 '{"model": "tiny", "prompt": "x", "logprobs": 50}' "logprobs over 5"
corpus 400 '{"model": "tiny", "prompt": "x", "route": "colour=red"}' "unknown route key"
corpus 404 '{"model": "nope", "prompt": "x"}' "unknown model"
python3 -c "import json; print(json.dumps({'model': 'tiny', 'prompt': 'x' * 200000}))" > "$dir/big.json"
got=$(code "$base/v1/completions" --data-binary @"$dir/big.json")
check "oversized body -> 413 ($got)" [ "$got" = 413 ]
got=$(code "$base/v1/completions" -H 'Transfer-Encoding: chunked' --data-binary @"$dir/big.json")
check "oversized chunked body (no Content-Length) -> 413 ($got)" [ "$got" = 413 ]
check "unknown endpoint -> 404" [ "$(code "$base/v2/nothing")" = 404 ]
check "GET on /v1/completions -> 405" [ "$(code "$base/v1/completions")" = 405 ]

# a client gone mid-stream: its generation is cancelled (finished_reason="cancelled")
curl -sN --max-time 1 "$base/v1/completions" \
  -d '{"model": "tiny", "prompt": "go on", "max_tokens": 60000, "ignore_eos": true, "stream": true}' \
  > "$dir/gone.txt"
cancelled=0
for _ in $(seq 1 300); do
  cancelled=$(curl -s "$base/metrics" | sed -n 's/^mambad_request_finished_total{model="tiny",finished_reason="cancelled"} //p')
  [ "${cancelled:-0}" -ge 1 ] && break
  sleep 0.2
done
check "client gone mid-stream: generation cancelled (got data first: $(grep -c '^data:' "$dir/gone.txt") events)" \
  [ "${cancelled:-0}" -ge 1 ]
curl -s --max-time 1 "$base/v1/completions" \
  -d '{"model": "tiny", "prompt": "go on", "max_tokens": 60000, "ignore_eos": true}' > /dev/null
gone499=0
for _ in $(seq 1 300); do
  gone499=$(curl -s "$base/metrics" | sed -n 's/^mambad_http_requests_total{endpoint="\/v1\/completions",model="tiny",code="499"} //p')
  [ "${gone499:-0}" -ge 1 ] && break
  sleep 0.2
done
check "client gone during a buffered completion: generation stopped (499 counted)" [ "${gone499:-0}" -ge 1 ]
# the 499 is counted when the client is seen gone; the cancel reaches the worker after it
for _ in $(seq 1 300); do
  running=$(curl -s "$base/metrics" | sed -n 's/^mambad_num_requests_running //p')
  [ "$running" = 0 ] && break
  sleep 0.2
done
gen=$(curl -s "$base/metrics" | sed -n 's/^mambad_generation_tokens_total{model="tiny"} //p')
check "no generation left running after the cancel ($running), far fewer than 60000 tokens ($gen)" \
  [ "$running" = 0 -a "${gen:-0}" -lt 50000 ]

# slowloris: idle half-sent requests are closed by the timeout (3 s) while others are served
exec 5<>/dev/tcp/127.0.0.1/$port
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len' >&5
check "a good request is served while a slow client holds a connection" [ "$(post "$R")" = 200 ]
timeout 20 cat <&5 >/dev/null
check "the slow client's connection is closed by the idle timeout" [ $? != 124 ]
exec 5<&-
check "good request after the corpus: same text as before" \
  [ "$(post "$R")" = 200 -a "$(js 'd["choices"][0]["text"]' < "$dir/body")" = "$text" ]

# determinism under load: N concurrent seeded streams == each sent alone
python3 - "$base" "$N" <<'PY' && ok "$N concurrent streamed completions equal the same requests sent alone" || bad "determinism under load"
import json, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
base, n = sys.argv[1], int(sys.argv[2])
def run(i):
    req = {"model": "tiny", "prompt": f"request {i} says", "max_tokens": 12, "seed": 1000 + i,
           "temperature": 1.0, "stream": True}
    out = subprocess.run(["curl", "-sN", base + "/v1/completions", "-d", json.dumps(req)],
                         capture_output=True, text=True).stdout
    ev = [json.loads(l[6:]) for l in out.split("\n") if l.startswith("data: {")]
    assert out.rstrip().endswith("data: [DONE]"), out[-200:]
    return "".join(c["text"] for e in ev for c in e["choices"]), ev[0]["system_fingerprint"]
alone = [run(i) for i in range(n)]
with ThreadPoolExecutor(max_workers=n) as ex:
    together = list(ex.map(run, range(n)))
bad = [i for i in range(n) if alone[i] != together[i]]
assert not bad, [(i, alone[i], together[i]) for i in bad[:3]]
assert len(set(a[0] for a in alone)) > 1
PY

# metrics: promtool accepts them; the counters moved
curl -s "$base/metrics" > "$dir/metrics.txt"
if need promtool prometheus; then
  check "promtool check metrics" bash -c "promtool check metrics < '$dir/metrics.txt'"
else
  echo "SKIP promtool: the prometheus package cannot be installed here"
fi
check "metrics carry requests by code, tokens, histograms and worker gauges" python3 - "$dir/metrics.txt" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
for pat in [r'mambad_http_requests_total\{endpoint="/v1/completions",model="tiny",code="200"\} [1-9]',
            r'mambad_http_requests_total\{endpoint="/v1/completions",model="",code="400"\} [1-9]',
            r'mambad_http_requests_total\{endpoint="/v1/completions",model="tiny",code="404"\}|model="",code="404"',
            r'mambad_prompt_tokens_total\{model="tiny"\} [1-9]', r'mambad_generation_tokens_total\{model="tiny"\} [1-9]',
            r'mambad_time_to_first_token_seconds_count\{model="tiny"\} [1-9]',
            r'mambad_inter_token_latency_seconds_bucket\{model="tiny",le="\+Inf"\} [1-9]',
            r'mambad_e2e_request_latency_seconds_sum', r'mambad_request_queue_time_seconds_count\{model="tiny"\} [1-9]',
            r'mambad_batch_size_bucket\{model="tiny",le="64"\} [1-9]', r'mambad_batch_size_count\{model="tiny"\} [1-9]',
            r'mambad_num_requests_running 0', r'mambad_num_requests_waiting 0',
            r'mambad_worker_up\{worker="w0",route="[0-9a-f]{12}",device="[^"]*"\} 1', r'mambad_broker_queue_length']:
    assert re.search(pat, t), pat
PY

# the official openai client (npm) against the same gateway
if need node nodejs && need npm npm; then
  nd=${MBD_NODE_DIR:-$dir/node}
  mkdir -p "$nd"
  if [ -d "$nd/node_modules/openai" ] || (cd "$nd" && npm install --no-audit --no-fund --silent openai >/dev/null 2>&1); then
    cp "$src/tests/integration/gateway/openai_client.mjs" "$nd/"
    check "openai npm client: completion, stream, models.list" node "$nd/openai_client.mjs" "$base/v1" tiny
  else
    echo "SKIP openai client: npm install openai failed (no registry access?)"
  fi
else
  echo "SKIP openai client: node/npm cannot be installed"
fi

# a gateway whose tokenizer differs from the one the workers serve refuses the model
if grep -q 'mambad_worker_model_info{.*model="tiny".*tokenizer_digest="[0-9a-f]\{64\}"' "$dir/metrics.txt"; then
  other=${MBD_FIXTURES_DIR:-$src/../shared/fixtures}/tokenizers/qwen3/tokenizer.json
  if [ -f "$other" ]; then
    mkdir -p "$dir/other" && cp "$other" "$dir/other/tokenizer.json"
    port2=$((port + 1))
    "$bin/mambad-gateway" --connect "ipc://$dir/c.sock" --listen "127.0.0.1:$port2" \
      --model "tiny=$dir/other" > "$dir/gw2.log" 2>&1 &
    gw2=$!
    for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$port2/health/live" && break; sleep 0.1; done
    got=$(code "http://127.0.0.1:$port2/v1/completions" -d '{"model": "tiny", "prompt": "x"}')
    check "another tokenizer than the workers': 503 tokenizer_mismatch ($got)" \
      bash -c "[ $got = 503 ] && grep -q tokenizer_mismatch '$dir/body'"
    check "... and /health/ready says not ready" [ "$(code "http://127.0.0.1:$port2/health/ready")" = 503 ]
    kill -TERM "$gw2"; wait "$gw2"
  else
    echo "SKIP tokenizer mismatch: no second tokenizer fixture ($other)"
  fi
else
  echo "SKIP tokenizer mismatch: the workers report no tokenizer_digest (READY models[].tokenizer_digest)"
fi

# queue full (429) and deadline (504), on gateways of their own with tight limits
gateway() { # port, extra options...
  local p=$1; shift
  "$bin/mambad-gateway" --connect "ipc://$dir/c.sock" --listen "127.0.0.1:$p" --model "tiny=$dir/tiny" "$@" \
    >> "$dir/gw-extra.log" 2>&1 &
  extra=$!
  for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$p/health/live" && break; sleep 0.1; done
}
LONG='{"model": "tiny", "prompt": "go on", "max_tokens": 60000, "ignore_eos": true, "stream": true}'
gateway $((port + 2)) --max-running 1 --max-waiting 0
curl -sN "http://127.0.0.1:$((port + 2))/v1/completions" -d "$LONG" > "$dir/long.txt" &
holder=$!
for _ in $(seq 1 100); do [ -s "$dir/long.txt" ] && break; sleep 0.1; done
got=$(code "http://127.0.0.1:$((port + 2))/v1/completions" -d '{"model": "tiny", "prompt": "x"}')
check "generation slots and wait queue full: 429 queue_full ($got)" \
  bash -c "[ $got = 429 ] && grep -q queue_full '$dir/body'"
kill "$holder"; wait "$holder" 2>/dev/null
kill -TERM "$extra"; wait "$extra"
gateway $((port + 3)) --deadline-ms 300
got=$(code "http://127.0.0.1:$((port + 3))/v1/completions" \
  -d '{"model": "tiny", "prompt": "go on", "max_tokens": 60000, "ignore_eos": true}')
check "deadline passed mid-generation: 504 ($got)" [ "$got" = 504 ]
kill -TERM "$extra"; wait "$extra"

check "the gateway is still serving" [ "$(code "$base/health/live")" = 200 ]

# the gateway bench (tests/bench/bench_gateway.c) runs against this deployment
if [ -x "$bin/bench_gateway" ]; then
  check "bench_gateway runs (20 requests)" bash -c \
    "'$bin/bench_gateway' --connect 'ipc://$dir/c.sock' --http 127.0.0.1:$port --model tiny --requests 20 --concurrency 4"
fi

# shutdown with a stream in flight: it gets an error event and [DONE], all exit cleanly
curl -sN "$base/v1/completions" \
  -d '{"model": "tiny", "prompt": "go on", "max_tokens": 60000, "ignore_eos": true, "stream": true}' \
  > "$dir/shut.txt" &
reader=$!
for _ in $(seq 1 100); do [ -s "$dir/shut.txt" ] && break; sleep 0.1; done
kill -TERM "$up"; wait "$up"; st=$?; up=
wait "$reader"
check "SIGTERM mid-stream: mambad up exits 0 ($st)" [ "$st" = 0 ]
check "SIGTERM mid-stream: the stream ends with shutting_down and [DONE]" \
  bash -c "grep -q shutting_down '$dir/shut.txt' && tail -n 2 '$dir/shut.txt' | grep -q '^data: \[DONE\]'"
if [ "$fails" -gt 0 ]; then
  echo "$fails check(s) failed; up.log:"; tail -50 "$dir/up.log"; exit 1
fi
echo "all gateway checks passed"
