"""Shared pytest fixtures. Each section belongs to one area; add new sections below, apart."""

from __future__ import annotations

# ================================================================================================
# Client tests (tests/test_client_*.py): brokers to point oncelog.client at.
#
#   bootstrap        "127.0.0.1:PORT" of the EmbeddedBroker, or of librdkafka's mock cluster
#                    when the embedded broker cannot be imported
#   embedded_broker  the EmbeddedBroker itself (skips the test if there is none)
#   mock_cluster     librdkafka's built-in mock cluster (3 brokers): a second, independent
#                    implementation of the protocol to check our client against
#   fake_broker      FakeBroker: a scripted broker speaking real Kafka framing, for failures a
#                    real broker will not produce on demand (lost responses, NOT_LEADER, ...)
# ================================================================================================
import os
from typing import Any

import pytest
from support.fake_broker import FakeBroker, MockCluster
from support.zookeeper import require_zookeeper

try:
    from oncelog.server.embedded import EmbeddedBroker
except ImportError:  # the broker is not there yet: client tests run against the mock cluster
    EmbeddedBroker = None  # type: ignore[assignment,misc]

# The suite is CPU-bound on two cores, and most JVMs it starts (Spark's drivers, Kafka's brokers
# and tools) live seconds to a minute on small data: C1 alone compiles what they run for a
# fraction of the CPU the C2 compiler spends, and the serial collector has no GC threads to
# keep busy. Inherited by every process the tests start (spark-submit reads SPARK_SUBMIT_OPTS,
# scripts/kafka.sh KAFKA_JVM_PERFORMANCE_OPTS); a value already set is kept.
_QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", _QUICK_JVM)
os.environ.setdefault("KAFKA_JVM_PERFORMANCE_OPTS", _QUICK_JVM + " -Djava.awt.headless=true")


@pytest.fixture
def mock_cluster():
    cluster = MockCluster()
    yield cluster
    cluster.close()


@pytest.fixture
def embedded_broker():
    if EmbeddedBroker is None:
        pytest.skip("oncelog.server.embedded is not available")
    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture
def bootstrap():
    if EmbeddedBroker is not None:
        with EmbeddedBroker() as broker:
            yield broker.bootstrap_servers
    else:
        cluster = MockCluster()
        yield cluster.bootstrap_servers
        cluster.close()


@pytest.fixture
def fake_broker():
    brokers: list[FakeBroker] = []

    def start(topics: dict[str, int] | None = None, **kwargs: Any) -> FakeBroker:
        broker = FakeBroker(topics, **kwargs)
        brokers.append(broker)
        return broker

    yield start
    for broker in brokers:
        broker.close()


# ================================================================================================
# end of the client tests section
# ================================================================================================


# -- cluster tests --------------------------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that starts ZooKeeper (through the zookeeper_server fixture, however
    indirectly) is a ``cluster`` test, so that the fast tier (-m "not cluster") leaves it out
    without each test having to say so."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "zookeeper_server" in names:
            item.add_marker(pytest.mark.cluster)
        if any(n in names for n in _KAFKA_FIXTURES):
            item.add_marker(pytest.mark.kafka)
    _mark_broker_tests(items)


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory):
    """One ZooKeeper server for the session's cluster tests (each test takes a chroot of its
    own)."""
    from oncelog.harness.zookeeper import ZooKeeperServer

    require_zookeeper()
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), fsync=False,
                             die_with_parent=True)
    server.start()
    yield server
    server.stop()


# -- Apache Kafka beside oncelog (tests/test_kafka_*.py) ------------------------------------------
#
#   apache_kafka   the bootstrap address of one real Apache Kafka (KRaft, one node) shared by the
#                  whole session (see support/apache_kafka.py); tests use names of their own
#   kafka_tools    Kafka's command-line tools run in one JVM per worker (KafkaTools.run)
#   kafka_jars     the ':'-separated classpath of Kafka's client, Streams, tools and broker
# Every test using one of them is marked ``kafka`` (left out of the fast tier).

_KAFKA_FIXTURES = ("apache_kafka", "kafka_tools", "kafka_jars")


def pytest_configure(config: pytest.Config) -> None:
    global _guarded
    _guarded = re.search(r"\bnot\s+broker\b", config.getoption("markexpr") or "") is not None
    if not hasattr(config, "workerinput"):  # the controller: the workers inherit the directory
        from support.apache_kafka import shared_dir

        shared_dir()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        from support.apache_kafka import stop_shared_kafka

        stop_shared_kafka()


@pytest.fixture(scope="session")
def apache_kafka() -> str:
    from support.apache_kafka import shared_kafka_bootstrap

    return shared_kafka_bootstrap()


@pytest.fixture(scope="session")
def kafka_tools(tmp_path_factory: pytest.TempPathFactory):
    from support.apache_kafka import require_kafka

    from oncelog.harness.apache_kafka import KafkaTools

    require_kafka()
    tools = KafkaTools(tmp_path_factory.mktemp("kafka-tools"))
    yield tools
    tools.close()


@pytest.fixture(scope="session")
def kafka_jars() -> str:
    from support.apache_kafka import require_kafka

    from oncelog.harness.apache_kafka import kafka_classpath

    require_kafka()
    return kafka_classpath()


# -- the broker marker: the fast tier starts no broker --------------------------------------------
#
# Every test that starts a broker is marked ``broker`` at collection, so that the fast tier
# (scripts/test.sh --fast: -m "not broker and not slow and not spark and not cluster and not
# kafka") is a unit tier. A test starts a broker when
#   - it uses a fixture that starts one (embedded_broker, bootstrap, a fixture of its module or
#     of tests/support that reaches one of _BROKER_NAMES, the Kafka fixtures), or
#   - its own body, its class, or a function or class of its module or of tests/support it
#     calls, reaches one of _BROKER_NAMES (found by name in the source, transitively; an
#     ``oncelog broker`` command line the source builds counts), or
#   - it is marked ``broker`` by hand, where the source does not show it (a broker fixture taken
#     with request.getfixturevalue for some parameters only: pytest.param(..., marks=...)).
# The rule enforces itself: in a run that leaves the broker tests out, a test not marked
# ``broker`` that starts a broker in this process (BrokerServer.start: EmbeddedBroker and all
# else that serves) or in a subprocess running an oncelog command that starts one
# (_broker_command) fails, naming the marker to add.

import ast
import functools
import inspect
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

_BROKER_NAMES = frozenset({
    "EmbeddedBroker", "BrokerServer", "BrokerProcess", "LocalCluster", "run_broker",
    "oncelog broker",  # see _broker_argv
})
_BROKER_FIXTURES = frozenset({"embedded_broker", "bootstrap"})
_TESTS = Path(__file__).resolve().parent
# oncelog commands that start a broker (and `cluster up`), and modules run with -m that do
_BROKER_COMMANDS = frozenset({"broker", "demo"})
_BROKER_MODULES = frozenset({"oncelog.examples.tour", "oncelog.demo",
                             "oncelog.harness.local_cluster", "oncelog.harness.differential"})
_BROKER_ARGV = "oncelog broker"  # a command line the test builds: ["broker", "--data-dir", ...]
_CLI_CALLS = frozenset({"oncelog", "run", "Popen", "check_output", "check_call"})


def _broker_argv(node: ast.AST) -> tuple[str, ...]:
    """(_BROKER_ARGV,) when ``node`` is a list whose first item is "broker", or a call of the
    oncelog command (tests/support/cli.py) or of subprocess with "broker" first."""
    first = None
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        first = node.elts[0]
    elif isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in _CLI_CALLS:
            first = node.args[0]
    if isinstance(first, ast.Constant) and first.value == "broker":
        return (_BROKER_ARGV,)
    return ()


def _referenced_names(node: ast.AST) -> set[str]:
    """The names ``node`` refers to: bare names, and attribute names that are _BROKER_NAMES
    (``harness.BrokerProcess``); annotations left out (a parameter typed ``BrokerProcess``
    starts nothing)."""
    names: set[str] = set()
    # The arguments of calls other than the command's: parse_args(["broker"]) starts nothing.
    # A call is taken off the stack before its arguments (they are its children): one pass.
    parsed: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Call) and \
                getattr(n.func, "id", getattr(n.func, "attr", None)) not in _CLI_CALLS:
            parsed.update(id(a) for a in n.args)
        if id(n) not in parsed and _BROKER_ARGV in _broker_argv(n):
            names.add(_BROKER_ARGV)
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute) and n.attr in _BROKER_NAMES:
            names.add(n.attr)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = n.args
            for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if a is not None:
                    a.annotation = None
            n.returns = None
        if isinstance(n, ast.AnnAssign):
            stack.extend(x for x in (n.target, n.value) if x is not None)
            continue
        stack.extend(ast.iter_child_nodes(n))
    return names


_module_cache: dict[str, frozenset[str]] = {}
# Per module: each top-level function's names (_referenced_names) by (name, first line), so a
# test function's own are not parsed from its source again.
_module_refs: dict[str, dict[tuple[str, int], set[str]]] = {}


@functools.cache
def _is_ours(obj: object) -> bool:
    """A function or class defined under tests/ (test modules and tests/support)."""
    try:
        path = inspect.getsourcefile(obj)  # type: ignore[arg-type]
    except TypeError:
        return False
    return path is not None and Path(path).resolve().is_relative_to(_TESTS)


def _module_broker_names(module: types.ModuleType) -> frozenset[str]:
    """The top-level names of ``module`` that reach a broker: _BROKER_NAMES, names imported
    from tests/support that reach one in their own module, and the module's functions and
    classes that refer to any of these (to a fixed point)."""
    key = module.__name__
    if key in _module_cache:
        return _module_cache[key]
    _module_cache[key] = frozenset()  # a cycle reaches nothing new
    seeds = set(_BROKER_NAMES)
    for name, obj in vars(module).items():
        if (isinstance(obj, (types.FunctionType, type)) and obj.__module__ != key
                and _is_ours(obj) and _reaches_broker(obj)):
            seeds.add(name)
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        _module_cache[key] = frozenset(seeds)
        return _module_cache[key]
    refs = {}
    own = _module_refs.setdefault(key, {})
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            refs[node.name] = _referenced_names(node)
            first = min((d.lineno for d in node.decorator_list), default=node.lineno)
            own[(node.name, first)] = refs[node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):  # e.g. FIXTURE = pytest.fixture(f)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and node.value is not None:
                    refs[t.id] = _referenced_names(node.value)
    reaching = set(seeds)
    changed = True
    while changed:
        changed = False
        for name, used in refs.items():
            if name not in reaching and used & reaching:
                reaching.add(name)
                changed = True
    _module_cache[key] = frozenset(reaching)
    return _module_cache[key]


@functools.cache
def _reaches_broker(obj: object) -> bool:
    """Whether function or class ``obj`` (of a module under tests/) refers to a name of its
    module that reaches a broker."""
    obj = inspect.unwrap(obj)  # type: ignore[arg-type]
    module = sys.modules.get(getattr(obj, "__module__", ""))
    if module is None:
        return False
    reaching = _module_broker_names(module)
    code = getattr(obj, "__code__", None)
    if code is not None and obj.__qualname__ == obj.__name__:  # type: ignore[attr-defined]
        names = _module_refs.get(module.__name__, {}).get(
            (obj.__name__, code.co_firstlineno))  # type: ignore[attr-defined]
        if names is not None:
            return bool(names & reaching)
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(obj)))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError):
        return False
    return bool(_referenced_names(node) & reaching)


def _starts_broker(item: pytest.Item) -> bool:
    if any(n in _BROKER_FIXTURES or n in _KAFKA_FIXTURES
           for n in getattr(item, "fixturenames", ())):
        return True
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for defs in info.name2fixturedefs.values():
            for d in defs:
                if _is_ours(d.func) and _reaches_broker(d.func):
                    return True
    func = getattr(item, "function", None)
    if func is not None and _is_ours(func) and _reaches_broker(func):
        return True
    cls = getattr(item, "cls", None)
    return cls is not None and _reaches_broker(cls)


def _mark_broker_tests(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("broker") is None and _starts_broker(item):
            item.add_marker(pytest.mark.broker)


# The guard: which test runs (None outside tests: collection, session start), what it started.
# It is on in a run that leaves the broker tests out (-m "not broker ...": the fast tier), where
# a test that starts one unmarked would otherwise pass for a unit test.
_guarded = False
_running: pytest.Item | None = None
_unmarked_starts: list[str] = []


def _broker_started(what: str) -> None:
    item = _running
    if item is None or not _guarded or item.get_closest_marker("broker") is not None:
        return
    _unmarked_starts.append(what)
    raise RuntimeError(
        f"{item.nodeid} started a broker ({what}) but is not marked `broker`; tests/conftest.py "
        "marks what it sees in the source; mark this one by hand (@pytest.mark.broker, or "
        "pytestmark in its module) so that the fast tier leaves it out")


def _broker_command(args: Any) -> str | None:
    """The oncelog command line among ``args`` (a Popen argument) that starts a broker."""
    if isinstance(args, (str, bytes, os.PathLike)):
        argv = [os.fsdecode(args)] if not isinstance(args, str) else args.split()
    else:
        argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    for i, a in enumerate(argv):
        if a in _BROKER_MODULES:
            return " ".join(argv[max(0, i - 1):i + 1])
        if a in ("oncelog", "oncelog.cli.main", "oncelog.__main__") or a.endswith("/oncelog"):
            if "--help" in argv or "-h" in argv:
                return None
            rest = [x for x in argv[i + 1:] if not x.startswith("-")]
            command = " ".join(rest[:2])
            if command == "cluster up":
                return "oncelog cluster up"
            if rest and rest[0] in _BROKER_COMMANDS:
                return f"oncelog {rest[0]}"
            return None
    return None


def _install_broker_guard() -> None:
    try:
        from oncelog.server.network import BrokerServer
    except ImportError:
        return
    start = BrokerServer.start

    async def guarded_start(self: Any) -> None:
        _broker_started("BrokerServer.start")
        await start(self)

    BrokerServer.start = guarded_start  # type: ignore[method-assign]
    popen_init = subprocess.Popen.__init__

    def guarded_popen_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if _guarded and _running is not None:
            command = _broker_command(args[0] if args else kwargs.get("args", ()))
            if command is not None:
                _broker_started(command)
        popen_init(self, *args, **kwargs)

    subprocess.Popen.__init__ = guarded_popen_init  # type: ignore[method-assign]


_install_broker_guard()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    global _running
    _running = item
    _unmarked_starts.clear()
    try:
        yield
    finally:
        _running = None


@pytest.fixture(autouse=True)
def _broker_marker_checked(request: pytest.FixtureRequest):
    """Fails a test that started a broker without the ``broker`` marker, even if the test
    caught the error the start raised."""
    yield
    if _unmarked_starts:
        starts = ", ".join(sorted(set(_unmarked_starts)))
        _unmarked_starts.clear()
        pytest.fail(f"{request.node.nodeid} started a broker ({starts}) but is not marked "
                    "`broker` (see tests/conftest.py)", pytrace=False)
