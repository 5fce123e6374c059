#!/usr/bin/env bash
# Run librdkafka's own integration tests (the ones that need a broker) against oncelog.
#
#   scripts/librdkafka_suite.sh RDKAFKA_SRC [OUT_DIR]
#
# RDKAFKA_SRC is a librdkafka source tree whose tests/test-runner is already built (see
# librdkafka's tests/README.md; this script builds nothing). Each test number runs in its own
# test-runner process (`TESTS=0nnn test-runner -L`), because test-runner aborts the whole run
# when one test times out. The broker is started from this checkout as librdkafka's "default"
# test scenario describes the cluster (tests/scenarios/default.json): topic auto-creation on and
# 4 partitions per auto-created topic. SCENARIO=noautocreate starts it with auto-creation off and
# runs only that scenario's tests. Tests that call Kafka's kafka-topics.sh or kafka-acls.sh get
# wrappers around our CLI (KAFKA_PATH); tests that need Kafka's Java client, SSL, SASL or broker
# racks skip or fail as they would on a cluster without them.
#
# Environment:
#   JOBS=2                 test-runner processes at once
#   TESTS="0001 0012 ..."  test numbers to run (default: every number with a broker test)
#   SCENARIO=default       or noautocreate
#   PORT=29092             the broker's port (the first broker's with BROKER_COUNT)
#   BROKER_COUNT=1         3: a local cluster (`oncelog cluster up`, ZooKeeper), for the tests
#                          that create topics with replication factor 3
#   TEST_KAFKA_VERSION     the broker version the tests assume (librdkafka's default: 2.4.0)
#   TEST_TIMEOUT=900       seconds before one test-runner process is killed
#   QUICK=0                1: test-runner -Q (quick mode: fewer messages, some tests skipped)
#
# Output: OUT_DIR/NNNN.log per test number, OUT_DIR/broker.log, OUT_DIR/results.txt (one line
# per test: name, PASSED/FAILED/SKIPPED, the first failure message) and a count at the end.
set -euo pipefail

if [[ $# -lt 1 || ! -x "$1/tests/test-runner" ]]; then
    echo "usage: $0 RDKAFKA_SRC [OUT_DIR]   (RDKAFKA_SRC/tests/test-runner must be built)" >&2
    exit 2
fi
SRC=$(cd "$1" && pwd)
OUT=$(mkdir -p "${2:-/tmp/librdkafka-suite}" && cd "${2:-/tmp/librdkafka-suite}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-2}
SCENARIO=${SCENARIO:-default}
PORT=${PORT:-29092}
TEST_TIMEOUT=${TEST_TIMEOUT:-900}
RUNNER_ARGS="-L -s $SCENARIO"
[[ ${QUICK:-0} == 1 ]] && RUNNER_ARGS="$RUNNER_ARGS -Q"
PY="$ROOT/.venv/bin/python"

# The broker tests of librdkafka's test table (tests/test.c), with their scenario.
list_tests() {
    "$PY" - "$SRC/tests/test.c" "$SCENARIO" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
body = src[src.index("struct test tests[] = {"):]
body = body[:body.index("\n};")]
numbers = []
for chunk in body.split("_TEST(")[1:]:
    name, flags = re.match(r"\s*(\w+),\s*([^,)]*)", chunk).groups()
    if "TEST_F_LOCAL" in flags or "TEST_F_MANUAL" in flags:
        continue
    scenario = re.search(r'\.scenario\s*=\s*"([^"]*)"', chunk)
    scenarios = scenario.group(1).split(",") if scenario else ["default"]
    if sys.argv[2] in scenarios and name[:4] not in numbers:
        numbers.append(name[:4])
print(" ".join(numbers))
EOF
}
TESTS=${TESTS:-$(list_tests)}

DATA=$(mktemp -d /tmp/librdkafka-suite-data.XXXXXX)
AUTO=true
[[ $SCENARIO == noautocreate ]] && AUTO=false
SETTINGS=(--set num.partitions=4 --set auto.create.topics.enable=$AUTO)
if [[ ${BROKER_COUNT:-1} -gt 1 ]]; then
    # The scenario's replication factor 3 (tests that create topics with it): a local cluster,
    # brokers on PORT, PORT+1, ... (their logs are copied to OUT/broker-N.log at exit).
    SETTINGS+=(--set default.replication.factor=3)
    "$ROOT/.venv/bin/oncelog" cluster up --brokers "$BROKER_COUNT" --data-dir "$DATA" \
        --base-port "$PORT" "${SETTINGS[@]}" > "$OUT/broker.log" 2>&1 \
        || { cat "$OUT/broker.log" >&2; exit 1; }
    trap '"$ROOT/.venv/bin/oncelog" cluster down --data-dir "$DATA" > /dev/null 2>&1;
          for b in "$DATA"/broker-*/; do cp "$b/broker.log" "$OUT/$(basename "$b").log"; done
          rm -rf "$DATA"' EXIT
else
    "$ROOT/.venv/bin/oncelog" broker --data-dir "$DATA" --port "$PORT" "${SETTINGS[@]}" \
        > "$OUT/broker.log" 2>&1 &
    BROKER=$!
    trap 'kill $BROKER 2>/dev/null; wait $BROKER 2>/dev/null; rm -rf "$DATA"' EXIT
    for _ in $(seq 50); do
        grep -q "listening" "$OUT/broker.log" && break
        sleep 0.2
    done
    grep -q "listening" "$OUT/broker.log" || { cat "$OUT/broker.log" >&2; exit 1; }
fi

echo "bootstrap.servers=127.0.0.1:$PORT" > "$OUT/test.conf"

# Some tests run Kafka's shell tools from $KAFKA_PATH/bin (kafka-topics.sh --create, kafka-acls.sh
# --add); our CLI takes the same options, so these two wrappers stand in for them.
mkdir -p "$OUT/kafka/bin"
for tool in topics acls; do
    cat > "$OUT/kafka/bin/kafka-$tool.sh" <<EOF
#!/usr/bin/env bash
args=() action=""
for a in "\$@"; do
    case \$a in
        --create|--alter|--add|--delete|--remove|--list|--describe) action=\${a#--} ;;
        *) args+=("\$a") ;;
    esac
done
exec "$ROOT/.venv/bin/oncelog" $tool "\$action" "\${args[@]}"
EOF
    chmod +x "$OUT/kafka/bin/kafka-$tool.sh"
done
export KAFKA_PATH="$OUT/kafka" BROKERS="127.0.0.1:$PORT"
export RDKAFKA_TEST_CONF="$OUT/test.conf" OUT SRC RUNNER_ARGS TEST_TIMEOUT
export LD_LIBRARY_PATH="$SRC/src:$SRC/src-cpp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

run_one() {
    cd "$SRC/tests"
    TESTS=$1 timeout -s KILL "$TEST_TIMEOUT" ./test-runner $RUNNER_ARGS \
        > "$OUT/$1.log" 2>&1 || echo "test-runner exit $?" >> "$OUT/$1.log"
    echo "$1 done"
}
export -f run_one
echo "running $(wc -w <<< "$TESTS") test numbers, $JOBS at a time: $TESTS"
tr ' ' '\n' <<< "$TESTS" | xargs -P "$JOBS" -I{} bash -c 'run_one {}'

# One line per test, from test-runner's closing table (name | state | duration | reason); a
# runner that died before its table (a test timed out, or it was killed) counts as FAILED.
"$PY" - "$OUT" $TESTS > "$OUT/results.txt" <<'EOF'
import re, sys
out, numbers = sys.argv[1], sys.argv[2:]
counts = {"PASSED": 0, "FAILED": 0, "SKIPPED": 0}
not_run = ("negative test flags", "not included in TESTS list", "requires test scenario",
           "manual test")
for n in numbers:
    text = re.sub(r"\x1b\[[0-9;]*m", "", open(f"{out}/{n}.log", errors="replace").read())
    rows = re.findall(r"^\| (" + n + r"\w*)\s+\|\s+(\w+) \|\s+\S+ \|(.*)$", text, re.M)
    verdicts = {}
    for name, state, why in rows:
        why = why.strip()
        if state == "SKIPPED" and (not why or any(r in why for r in not_run)):
            continue
        verdicts[name] = (state, why)
    for name, state in re.findall(r"=+ Test (" + n + r"\w*) (PASSED|FAILED) =+", text):
        verdicts.setdefault(name, (state, ""))  # a runner that aborted before its table
    for name, sub, where, why in re.findall(
            r'### Test "(' + n + r'\w*)( \([^)]*\))?" failed at (\S+) at [^\n]*###\n([^\n]*)', text):
        if verdicts.get(name, ("FAILED", ""))[1] == "":
            verdicts[name] = ("FAILED", f"{sub.strip()} {where}: {why.strip()}".strip())
    for name in re.findall(r"Test (" + n + r"\w*) timed out", text):
        verdicts[name] = ("FAILED", "timed out (test-runner aborts the run)")
    if not verdicts and rows:
        # Every test of this number was filtered out, e.g. TEST_F_KNOWN_ISSUE (run with -k).
        verdicts[n] = ("SKIPPED", "not run by test-runner: " + rows[0][2].strip())
    if not verdicts:
        last = text.strip().splitlines()[-1] if text.strip() else "no output"
        verdicts[n] = ("FAILED", "no verdict: " + last[:200])
    for name, (state, why) in verdicts.items():
        state = {"PASSED": "PASSED", "SKIPPED": "SKIPPED"}.get(state, "FAILED")
        counts[state] += 1
        print(f"{name}\t{state}\t{why}")
print(f"{counts['PASSED']} passed, {counts['FAILED']} failed, {counts['SKIPPED']} skipped")
EOF
cat "$OUT/results.txt"
