#!/usr/bin/env bash
# Create .venv at the repository root and install oncelog with PySpark (the demo and the Spark
# data source) and the test dependencies, once; again when pyproject.toml or this script
# changes. Installs Debian packages the tests need on request:
#   --with-kcat       kcat (the interop tests)
#   --with-postgres   a PostgreSQL server (the dual-write tests start one of their own)
#   --with-zookeeper  Apache ZooKeeper (cluster mode; the cluster tests start their own)
#   --with-node       Node.js and the npm clients of tests/node/package.json (the Node interop)
#   --with-chromium   Chromium (the web console's tests load its pages in headless Chromium)
#   --with-openssl    the openssl command (the TLS tests make their certificates with it)
#   --with-kafka      Apache Kafka's broker, tools, Java client and Kafka Streams, from Maven
#                     Central into .cache/kafka (scripts/kafka.sh), and Spark's own Kafka
#                     connector (scripts/kafka.sh spark-jars): the tests beside a real Kafka
#   --with-netns      iproute2 and iptables (the fault-injection tests and
#                     scripts/faults.sh put each node in a network namespace of its own)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
want_kcat="" want_postgres="" want_zookeeper="" want_node="" want_chromium="" want_openssl="" want_kafka="" want_netns=""
for arg in "$@"; do
  case "$arg" in
    --with-kcat) want_kcat=1 ;;
    --with-postgres) want_postgres=1 ;;
    --with-zookeeper) want_zookeeper=1 ;;
    --with-node) want_node=1 ;;
    --with-chromium) want_chromium=1 ;;
    --with-openssl) want_openssl=1 ;;
    --with-kafka) want_kafka=1 ;;
    --with-netns) want_netns=1 ;;
    *) echo "bootstrap.sh: unknown option $arg (--with-kcat, --with-postgres," \
            "--with-zookeeper, --with-node, --with-chromium, --with-openssl, --with-kafka," \
            "--with-netns)" >&2; exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.oncelog-installed
hash=$(cat pyproject.toml setup.py src/oncelog/records/*.[ch] "$0" | sha256sum | cut -d" " -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$hash" ] \
    || ! ls src/oncelog/records/_recordwalk*.so src/oncelog/records/_columnar*.so \
        >/dev/null 2>&1; then  # the built C extensions
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test,spark,cluster]'
  echo "$hash" > "$stamp"
fi
packages=()
if [ -n "$want_kcat" ] && ! command -v kcat >/dev/null 2>&1; then
  packages+=(kcat)
fi
if [ -n "$want_postgres" ] && ! command -v pg_ctl >/dev/null 2>&1 \
    && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  packages+=(postgresql)
fi
if [ -n "$want_zookeeper" ] && [ ! -f /usr/share/java/zookeeper.jar ]; then
  packages+=(zookeeper)
fi
if [ -n "$want_node" ] && ! command -v npm >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi
if [ -n "$want_chromium" ] && ! command -v chromium >/dev/null 2>&1; then
  packages+=(chromium)
fi
if [ -n "$want_openssl" ] && ! command -v openssl >/dev/null 2>&1; then
  packages+=(openssl)
fi
if [ -n "$want_kafka" ] && { ! command -v mvn >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; }; then
  packages+=(maven openjdk-17-jdk-headless)
fi
if [ -n "$want_netns" ]; then
  command -v ip >/dev/null 2>&1 || packages+=(iproute2)
  command -v iptables-restore >/dev/null 2>&1 || packages+=(iptables)
fi
if [ "${#packages[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
fi
if [ -n "$want_node" ]; then
  node_stamp=tests/node/node_modules/.oncelog-installed
  node_hash=$(sha256sum tests/node/package.json | cut -d" " -f1)
  if [ ! -f "$node_stamp" ] || [ "$(cat "$node_stamp")" != "$node_hash" ]; then
    (cd tests/node && npm install --no-package-lock --no-audit --no-fund --loglevel=error)
    echo "$node_hash" > "$node_stamp"
  fi
fi
if [ -n "$want_kafka" ]; then
  bash scripts/kafka.sh install
  bash scripts/kafka.sh spark-jars >/dev/null
fi
