#!/usr/bin/env bash
# Apache Kafka's own command-line tools, by their usual names, installed on first use.
#
#   bash scripts/kafka.sh TOOL [ARGS...]   run one of Kafka's bin/ tools, e.g.
#       scripts/kafka.sh kafka-topics --bootstrap-server localhost:9092 --list
#       scripts/kafka.sh kafka-server-start server.properties
#   bash scripts/kafka.sh list              the tool names
#   bash scripts/kafka.sh install           resolve Kafka now (bootstrap.sh --with-kafka does)
#   bash scripts/kafka.sh version           the Kafka version in use
#   bash scripts/kafka.sh classpath         the jars, ':'-separated (javac/java -cp)
#   bash scripts/kafka.sh spark-jars        Spark's own Kafka connector (spark-sql-kafka-0-10)
#                                           and its dependencies, ','-separated for spark.jars
#
# Maven resolves the newest Apache Kafka 4.x release whose broker, tools, client, Streams,
# metadata shell, MirrorMaker and Trogdor all resolve (4.4.0, else 4.3.x) from
# scripts/kafka/pom.xml into .cache/kafka/VERSION/lib (ignored by git). Like Kafka's bin scripts
# this honours KAFKA_HEAP_OPTS (default -Xmx256M for tools, -Xmx1G -Xms1G for the broker),
# KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_LOG4J_OPTS and KAFKA_OPTS; ONCELOG_KAFKA_VERSION pins a
# version.
set -euo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
cache="$root/.cache/kafka"
candidates="${ONCELOG_KAFKA_VERSION:-4.4.0 4.3.1 4.3.0}"

# tool name -> main class (Kafka 4.x's bin/*.sh)
declare -A tools=(
  [kafka-acls]=org.apache.kafka.tools.AclCommand
  [kafka-broker-api-versions]=org.apache.kafka.tools.BrokerApiVersionsCommand
  [kafka-client-metrics]=org.apache.kafka.tools.ClientMetricsCommand
  [kafka-cluster]=org.apache.kafka.tools.ClusterTool
  [kafka-configs]=kafka.admin.ConfigCommand
  [kafka-console-consumer]=org.apache.kafka.tools.consumer.ConsoleConsumer
  [kafka-console-producer]=org.apache.kafka.tools.ConsoleProducer
  [kafka-console-share-consumer]=org.apache.kafka.tools.consumer.ConsoleShareConsumer
  [kafka-consumer-groups]=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
  [kafka-consumer-perf-test]=org.apache.kafka.tools.ConsumerPerformance
  [kafka-delegation-tokens]=org.apache.kafka.tools.DelegationTokenCommand
  [kafka-delete-records]=org.apache.kafka.tools.DeleteRecordsCommand
  [kafka-dump-log]=org.apache.kafka.tools.DumpLogSegments
  [kafka-e2e-latency]=org.apache.kafka.tools.EndToEndLatency
  [kafka-features]=org.apache.kafka.tools.FeatureCommand
  [kafka-get-offsets]=org.apache.kafka.tools.GetOffsetShell
  [kafka-groups]=org.apache.kafka.tools.GroupsCommand
  [kafka-jmx]=org.apache.kafka.tools.JmxTool
  [kafka-leader-election]=org.apache.kafka.tools.LeaderElectionCommand
  [kafka-log-dirs]=org.apache.kafka.tools.LogDirsCommand
  [kafka-metadata-quorum]=org.apache.kafka.tools.MetadataQuorumCommand
  [kafka-metadata-shell]=org.apache.kafka.shell.MetadataShell
  [kafka-producer-perf-test]=org.apache.kafka.tools.ProducerPerformance
  [kafka-reassign-partitions]=org.apache.kafka.tools.reassign.ReassignPartitionsCommand
  [kafka-replica-verification]=org.apache.kafka.tools.ReplicaVerificationTool
  [kafka-server-start]=kafka.Kafka
  [kafka-share-consumer-perf-test]=org.apache.kafka.tools.ShareConsumerPerformance
  [kafka-share-groups]=org.apache.kafka.tools.consumer.group.ShareGroupCommand
  [kafka-storage]=kafka.tools.StorageTool
  [kafka-streams-application-reset]=org.apache.kafka.tools.StreamsResetter
  [kafka-streams-groups]=org.apache.kafka.tools.streams.StreamsGroupCommand
  [kafka-topics]=org.apache.kafka.tools.TopicCommand
  [kafka-transactions]=org.apache.kafka.tools.TransactionsCommand
  [kafka-verifiable-consumer]=org.apache.kafka.tools.VerifiableConsumer
  [kafka-verifiable-producer]=org.apache.kafka.tools.VerifiableProducer
  [kafka-verifiable-share-consumer]=org.apache.kafka.tools.VerifiableShareConsumer
  [kafka-run-class]=
  [kafka-server-stop]=
  [connect-distributed]=org.apache.kafka.connect.cli.ConnectDistributed
  [connect-standalone]=org.apache.kafka.connect.cli.ConnectStandalone
  [connect-mirror-maker]=org.apache.kafka.connect.mirror.MirrorMaker
  [connect-plugin-path]=org.apache.kafka.tools.ConnectPluginPath
  [trogdor-agent]=org.apache.kafka.trogdor.agent.Agent
  [trogdor-coordinator]=org.apache.kafka.trogdor.coordinator.Coordinator
)

die() { echo "kafka.sh: $*" >&2; exit 2; }

# Resolve Kafka into $cache/VERSION/lib once; print the version.
install_kafka() {
  if [ -f "$cache/current" ] && [ -d "$cache/$(cat "$cache/current")/lib" ] \
      && [ "$(cat "$cache/$(cat "$cache/current")/pom.sha" 2>/dev/null)" \
           = "$(sha256sum "$root/scripts/kafka/pom.xml" | cut -d' ' -f1)" ]; then
    cat "$cache/current"
    return
  fi
  command -v mvn >/dev/null || die "Maven (mvn) is needed to install Apache Kafka"
  mkdir -p "$cache"
  # one install at a time (test workers may ask at once); the next finds it done
  exec 9>"$cache/.install.lock"
  flock 9
  if [ -f "$cache/current" ] && [ -d "$cache/$(cat "$cache/current")/lib" ] \
      && [ "$(cat "$cache/$(cat "$cache/current")/pom.sha" 2>/dev/null)" \
           = "$(sha256sum "$root/scripts/kafka/pom.xml" | cut -d' ' -f1)" ]; then
    cat "$cache/current"
    return
  fi
  local v log
  for v in $candidates; do
    log="$cache/resolve-$v.log"
    rm -rf "$cache/$v.tmp"
    if mvn -B -q -U -f "$root/scripts/kafka/pom.xml" -Dkafka.version="$v" \
        dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$cache/$v.tmp/lib" >"$log" 2>&1; then
      rm -rf "${cache:?}/$v"
      mv "$cache/$v.tmp" "$cache/$v"
      sha256sum "$root/scripts/kafka/pom.xml" | cut -d' ' -f1 > "$cache/$v/pom.sha"
      echo "$v" > "$cache/current"
      echo "$v"
      return
    fi
    echo "kafka.sh: Apache Kafka $v does not resolve (see $log); trying the next" >&2
  done
  die "no Apache Kafka release of: $candidates resolves from Maven Central"
}

classpath() {
  local v
  v=$(install_kafka)
  local cp="" j
  for j in "$cache/$v"/lib/*.jar; do cp="${cp:+$cp:}$j"; done
  echo "$cp"
}

# Spark's Kafka connector at the pinned PySpark's version, else the newest 4.x below it.
spark_jars() {
  local py="$root/.venv/bin/python"
  [ -x "$py" ] || py=python3
  local want
  want=$("$py" -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null) \
    || die "PySpark is not installed (bash scripts/bootstrap.sh)"
  local dir="$cache/spark-$want"
  if [ ! -f "$dir/version" ]; then
    command -v mvn >/dev/null || die "Maven (mvn) is needed for Spark's Kafka connector"
    mkdir -p "$cache"
    exec 8>"$cache/.spark-install.lock"
    flock 8
  fi
  if [ ! -f "$dir/version" ]; then
    local v ok=""
    for v in $want 4.2.0 4.1.1 4.0.1; do
      rm -rf "$dir.tmp"
      if mvn -B -q -U -f "$root/scripts/kafka/spark-pom.xml" -Dspark.version="$v" \
          dependency:copy-dependencies -DincludeScope=runtime \
          -DoutputDirectory="$dir.tmp/lib" >"$cache/resolve-spark-$v.log" 2>&1; then
        ok=$v
        break
      fi
      echo "kafka.sh: spark-sql-kafka-0-10_2.13 $v does not resolve; trying an older one" >&2
    done
    [ -n "$ok" ] || die "Spark's Kafka connector does not resolve from Maven Central"
    echo "$ok" > "$dir.tmp/version"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
  fi
  if [ "$(cat "$dir/version")" != "$want" ]; then
    echo "kafka.sh: Maven Central serves no spark-sql-kafka-0-10 $want; using" \
         "$(cat "$dir/version") with PySpark $want" >&2
  fi
  # Leave out what Spark already ships (hadoop-client, scala-library, snappy, ... at Spark's own
  # versions): only the connector, its token provider, kafka-clients and commons-pool2 remain.
  local sparkjars
  sparkjars=$("$py" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
  local out="" j name
  for j in "$dir"/lib/*.jar; do
    name=$(basename "$j" .jar)
    name=${name%%-[0-9]*}
    if compgen -G "$sparkjars/$name-[0-9]*.jar" >/dev/null; then
      continue
    fi
    out="${out:+$out,}$j"
  done
  echo "$out"
}

[ $# -ge 1 ] || die "usage: kafka.sh TOOL [ARGS...] | list | install | version | classpath | spark-jars"
tool="${1%.sh}"
shift
case "$tool" in
  list) printf '%s\n' "${!tools[@]}" | sort; exit 0 ;;
  install) install_kafka >/dev/null; exit 0 ;;
  version) install_kafka; exit 0 ;;
  classpath) classpath; exit 0 ;;
  spark-jars) spark_jars; exit 0 ;;
esac
[ -n "${tools[$tool]+set}" ] || die "unknown tool '$tool' ($0 list shows them)"

if [ "$tool" = kafka-server-stop ]; then
  # as Kafka's: signal every broker this machine runs (optionally only --process.roles ...)
  pids=$(pgrep -f 'java.*kafka\.Kafka ' || true)
  [ -n "$pids" ] || { echo "No kafka server to stop" >&2; exit 1; }
  kill -s TERM $pids
  exit 0
fi

cp=$(classpath)
version=$(cat "$cache/current")
conf="$root/scripts/kafka"
main="${tools[$tool]}"
if [ "$tool" = kafka-run-class ]; then
  [ $# -ge 1 ] || die "usage: kafka.sh kafka-run-class CLASS [ARGS...]"
  main="$1"
  shift
fi
case "$tool" in
  kafka-server-start|connect-*|trogdor-*)
    heap="${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G}"
    log4j="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$conf/log4j2.yaml}"
    [ "$tool" != kafka-server-start ] || [ $# -ge 1 ] \
      || die "USAGE: kafka.sh kafka-server-start server.properties [--override property=value]*"
    ;;
  *)
    heap="${KAFKA_HEAP_OPTS:--Xmx256M}"
    log4j="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$conf/tools-log4j2.yaml}"
    ;;
esac
perf="${KAFKA_JVM_PERFORMANCE_OPTS:--server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExplicitGCInvokesConcurrent -XX:+DisableExplicitGC -Djava.awt.headless=true}"
# shellcheck disable=SC2086  # the *_OPTS are word lists, as in Kafka's kafka-run-class.sh
exec java $heap $perf $log4j -Dkafka.logs.dir="${LOG_DIR:-$cache/logs}" ${KAFKA_OPTS:-} \
  -cp "$cp" "$main" "$@"
