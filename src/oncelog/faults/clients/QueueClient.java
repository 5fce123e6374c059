// A workload client process of Kafka's Java client for the fault runs (issue 31): the queue,
// copier and drain roles of oncelog.faults.clients (workload.py) with the same flags and the
// same history lines (JSON, one per line, flushed per line; time = System.nanoTime(), the
// CLOCK_MONOTONIC of Python's time.monotonic_ns()). Built and started by java_command().
//
// Transactions: Kafka 4's producer uses transaction version 2 (KIP-890 part 2) when the broker
// finalizes it; what it chose is read from its TransactionManager and written to the client
// meta line. After a transaction that polled ends in anything but a commit, the consumer is
// rewound to the last committed positions (KAFKA-17582); a fenced or fatally failed producer,
// or one whose commit is unknown, is closed and replaced with the same transactional.id.

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.InvalidTopicException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.RecordTooLargeException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class QueueClient {
    // -- flags (the defaults of python -m oncelog.faults.clients) -----------------------------
    String role, process, bootstrap, historyPath, transactionalId, group, pollMode = "assign";
    Integer index;
    long seed = 0;
    double duration = 10, timeout = 30, idleStopS = 2, txnRatio = 0.5, abortRatio = 0.1, opTimeout = 10;
    int maxTxnOps = 4, reassignEvery = 25, pollMs = 100, requestTimeoutMs = 2000;
    int transactionTimeoutMs = 10000, sessionTimeoutMs = 6000, txnHoldMs = 0;
    List<String> keys = new ArrayList<>(), input = new ArrayList<>(), output = new ArrayList<>();

    // -- state -------------------------------------------------------------------------------
    Writer history;
    Random rng;
    volatile long deadline;
    volatile boolean stopped;
    long nextValue;
    KafkaConsumer<byte[], byte[]> consumer;
    KafkaProducer<byte[], byte[]> producer;  // idempotent, not transactional
    KafkaProducer<byte[], byte[]> txn;
    final Map<String, Long> safe = new HashMap<>();  // the next offset after the last ok op's reads
    List<Object> rebalances = new ArrayList<>();

    static class OpError extends Exception {
        final boolean definite, reset;

        OpError(String message, boolean definite, boolean reset) {
            super(message);
            this.definite = definite;
            this.reset = reset;
        }
    }

    static String describe(Throwable e) {
        Throwable t = e;
        if ((t instanceof ExecutionException || t.getClass() == KafkaException.class)
                && t.getCause() != null) {
            t = t.getCause();
        }
        return t.getClass().getSimpleName() + ": " + t.getMessage();
    }

    // -- JSON --------------------------------------------------------------------------------
    static void json(StringBuilder b, Object o) {
        if (o == null) {
            b.append("null");
        } else if (o instanceof String s) {
            b.append('"');
            for (char c : s.toCharArray()) {
                switch (c) {
                    case '"' -> b.append("\\\"");
                    case '\\' -> b.append("\\\\");
                    case '\n' -> b.append("\\n");
                    case '\r' -> b.append("\\r");
                    case '\t' -> b.append("\\t");
                    default -> {
                        if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                        else b.append(c);
                    }
                }
            }
            b.append('"');
        } else if (o instanceof Number || o instanceof Boolean) {
            b.append(o);
        } else if (o instanceof Map<?, ?> m) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : m.entrySet()) {
                if (!first) b.append(',');
                first = false;
                json(b, String.valueOf(e.getKey()));
                b.append(':');
                json(b, e.getValue());
            }
            b.append('}');
        } else if (o instanceof Collection<?> c) {
            b.append('[');
            boolean first = true;
            for (Object x : c) {
                if (!first) b.append(',');
                first = false;
                json(b, x);
            }
            b.append(']');
        } else {
            json(b, o.toString());
        }
    }

    static List<Object> list(Object... items) {
        return new ArrayList<>(List.of(items));
    }

    void write(Map<String, Object> line) {
        StringBuilder b = new StringBuilder();
        json(b, line);
        try {
            history.write(b.append('\n').toString());
            history.flush();
        } catch (IOException e) {
            throw new RuntimeException(e);
        }
    }

    void meta(String f, Object value, Map<String, Object> fields) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("type", "meta");
        line.put("f", f);
        line.put("process", process);
        line.put("time", System.nanoTime());
        if (value != null) line.put("value", value);
        line.putAll(fields);
        write(line);
    }

    class Op {
        final String f;
        final boolean isTxn;
        boolean done;

        Op(String f, Object value, boolean isTxn, Long at) {
            this.f = f;
            this.isTxn = isTxn;
            Map<String, Object> line = new LinkedHashMap<>();
            line.put("type", "invoke");
            line.put("f", f);
            line.put("process", process);
            line.put("time", at != null ? at : System.nanoTime());
            line.put("txn", isTxn);
            line.put("value", value);
            write(line);
        }

        void complete(String type, Object value, String error, Map<String, Object> fields) {
            if (done) throw new IllegalStateException("completed twice");
            done = true;
            Map<String, Object> line = new LinkedHashMap<>();
            line.put("type", type);
            line.put("f", f);
            line.put("process", process);
            line.put("time", System.nanoTime());
            line.put("txn", isTxn);
            line.put("value", value);
            if (error != null) line.put("error", error);
            if (fields != null) line.putAll(fields);
            write(line);
        }
    }

    Op invoke(String f, Object value, boolean isTxn) {
        return new Op(f, value, isTxn, null);
    }

    Map<String, Object> extra() {
        Map<String, Object> m = new LinkedHashMap<>();
        if (!rebalances.isEmpty()) {
            m.put("rebalance", rebalances);
            rebalances = new ArrayList<>();
        }
        return m;
    }

    // -- keys --------------------------------------------------------------------------------
    static TopicPartition tp(String key) {
        int i = key.lastIndexOf(':');
        return new TopicPartition(key.substring(0, i), Integer.parseInt(key.substring(i + 1)));
    }

    static String key(TopicPartition tp) {
        return tp.topic() + ":" + tp.partition();
    }

    static List<String> keysOf(Collection<TopicPartition> tps) {
        List<String> out = new ArrayList<>();
        for (TopicPartition t : tps) out.add(key(t));
        out.sort(null);
        return out;
    }

    static Object decode(byte[] raw) {
        String text = raw == null ? "" : new String(raw, StandardCharsets.UTF_8);
        try {
            return Long.parseLong(text);
        } catch (NumberFormatException e) {
            return text;
        }
    }

    record Rec(String key, long offset, Object value) {}

    static Map<String, List<Object>> reads(List<Rec> records) {
        Map<String, List<Object>> out = new TreeMap<>();
        for (Rec r : records) out.computeIfAbsent(r.key, k -> new ArrayList<>()).add(list(r.offset, r.value));
        return out;
    }

    static Map<String, Long> nextOffsets(List<Rec> records) {
        Map<String, Long> out = new TreeMap<>();
        for (Rec r : records) out.merge(r.key, r.offset + 1, Math::max);
        return out;
    }

    // -- clients -----------------------------------------------------------------------------
    Properties common() {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", process);
        p.put("request.timeout.ms", String.valueOf(requestTimeoutMs));
        p.put("reconnect.backoff.max.ms", "1000");
        return p;
    }

    void openConsumer(boolean readCommitted) {
        Properties p = common();
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, readCommitted ? "read_committed" : "read_uncommitted");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "50");
        p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, String.valueOf((long) (opTimeout * 1000)));
        if (group != null) {
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, String.valueOf(sessionTimeoutMs));
            p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, String.valueOf(Math.max(100, sessionTimeoutMs / 6)));
        }
        consumer = new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    List<Rec> poll(long ms) throws OpError {
        ConsumerRecords<byte[], byte[]> records;
        try {
            records = consumer.poll(Duration.ofMillis(ms));
        } catch (KafkaException e) {
            throw new OpError(describe(e), true, false);
        }
        List<Rec> out = new ArrayList<>();
        for (ConsumerRecord<byte[], byte[]> r : records) {
            out.add(new Rec(r.topic() + ":" + r.partition(), r.offset(), decode(r.value())));
        }
        return out;
    }

    Properties producerProps() {
        Properties p = common();
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "1");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, String.valueOf(requestTimeoutMs * 2 + 1));
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, String.valueOf((long) (opTimeout * 1000)));
        return p;
    }

    static boolean fatal(Throwable e) {
        return e instanceof ProducerFencedException || e instanceof InvalidProducerEpochException
                || e instanceof OutOfOrderSequenceException || e instanceof UnsupportedVersionException
                || e instanceof AuthorizationException || e instanceof IllegalStateException;
    }

    long send(String k, long value) throws OpError {
        if (producer == null) {
            producer = new KafkaProducer<>(producerProps(), new ByteArraySerializer(), new ByteArraySerializer());
        }
        TopicPartition t = tp(k);
        try {
            Future<RecordMetadata> f = producer.send(new ProducerRecord<>(t.topic(), t.partition(), null,
                    Long.toString(value).getBytes(StandardCharsets.UTF_8)));
            return f.get((long) (opTimeout * 1000), java.util.concurrent.TimeUnit.MILLISECONDS).offset();
        } catch (java.util.concurrent.TimeoutException e) {
            throw new OpError("no answer in time", false, false);
        } catch (InterruptedException e) {
            throw new RuntimeException(e);
        } catch (ExecutionException | KafkaException e) {
            Throwable cause = e instanceof ExecutionException ? e.getCause() : e;
            boolean definite = cause instanceof RecordTooLargeException || cause instanceof InvalidTopicException;
            if (!(cause instanceof org.apache.kafka.common.errors.RetriableException)) {
                producer.close(Duration.ZERO);  // a new producer id for the next sends
                producer = null;
            }
            throw new OpError(describe(e), definite, false);
        }
    }

    Map<String, Object> txnInit() throws OpError {
        Properties p = producerProps();
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, String.valueOf(transactionTimeoutMs));
        txn = new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
        try {
            txn.initTransactions();
        } catch (KafkaException e) {
            txn.close(Duration.ZERO);
            txn = null;
            throw new OpError(describe(e), false, true);
        }
        Map<String, Object> fields = new LinkedHashMap<>();
        Object tv = "unknown";
        try {  // what it negotiated: the producer's TransactionManager knows (no public API)
            Field f = KafkaProducer.class.getDeclaredField("transactionManager");
            f.setAccessible(true);
            Object manager = f.get(txn);
            tv = ((Boolean) manager.getClass().getMethod("isTransactionV2Enabled").invoke(manager)) ? 2 : 1;
        } catch (ReflectiveOperationException | RuntimeException e) {
            fields.put("transaction_version_error", describe(e));
        }
        fields.put("transaction_version", tv);
        fields.put("kafka_clients", org.apache.kafka.common.utils.AppInfoParser.getVersion());
        return fields;
    }

    void txnReset() throws OpError {
        if (txn != null) {
            txn.close(Duration.ZERO);
            txn = null;
        }
    }

    KafkaProducer<byte[], byte[]> t() throws OpError {
        if (txn == null) throw new OpError("no transactional producer (initTransactions failed)", true, true);
        return txn;
    }

    void initTxn(boolean reset) {
        while (true) {
            try {
                if (reset) txnReset();
                Map<String, Object> fields = txnInit();
                fields.put("init", reset ? "reset" : "first");
                clientMeta(fields);
                return;
            } catch (OpError e) {
                if (System.nanoTime() > deadline) return;
                meta("client", null, Map.of("error", "initTransactions: " + e.getMessage()));
                reset = true;
                sleep(200);
            }
        }
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            throw new RuntimeException(e);
        }
    }

    void clientMeta(Map<String, Object> fields) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("kind", "java");
        m.put("role", role);
        m.put("transactional_id", transactionalId);
        m.put("group", group);
        m.put("poll_mode", pollMode);
        m.putAll(fields);
        meta("client", null, m);
    }

    void txnAbortQuietly() {
        try {
            t().abortTransaction();
        } catch (OpError | KafkaException e) {
            initTxn(true);
        }
    }

    void txnCommit() throws OpError {
        KafkaProducer<byte[], byte[]> p = t();
        try {
            p.commitTransaction();  // bounded by max.block.ms (--op-timeout)
        } catch (org.apache.kafka.common.errors.TimeoutException e) {
            throw new OpError(describe(e), false, true);  // EndTxn unanswered: it may have committed
        } catch (KafkaException e) {
            Throwable cause = e.getCause() != null && e.getClass() == KafkaException.class ? e.getCause() : e;
            if (fatal(e) || fatal(cause)) throw new OpError(describe(e), false, true);
            try {  // abortable (a record or the offsets refused): abort, then it is certain
                p.abortTransaction();
            } catch (KafkaException e2) {
                throw new OpError(describe(e) + "; abort: " + describe(e2), false, true);
            }
            throw new OpError(describe(e), true, false);
        }
    }

    Map<String, Object> rewind() {
        Set<TopicPartition> assigned = consumer.assignment();
        Map<TopicPartition, OffsetAndMetadata> committed = new HashMap<>();
        if (group != null && !assigned.isEmpty()) {
            try {
                committed = consumer.committed(assigned, Duration.ofMillis((long) (opTimeout * 1000)));
            } catch (KafkaException e) {
                committed = new HashMap<>();
            }
        }
        Map<String, Object> went = new TreeMap<>();
        for (TopicPartition t : assigned) {
            String k = key(t);
            Long target = safe.get(k);
            OffsetAndMetadata c = committed.get(t);
            if (c != null && (target == null || c.offset() > target)) target = c.offset();
            try {
                if (target != null) {
                    consumer.seek(t, target);
                    went.put(k, target);
                } else {
                    consumer.seekToBeginning(List.of(t));
                    went.put(k, "beginning");
                }
            } catch (KafkaException e) {
                went.put(k, "seek failed: " + describe(e));
            }
        }
        return went;
    }

    /** A transaction of the micro-ops; polled: what a copier polled before it began. */
    void transaction(Op op, List<List<Object>> micro, boolean abort, List<Rec> polled) {
        List<List<Object>> done = new ArrayList<>();
        List<Object[]> handles = new ArrayList<>();
        List<Rec> read = new ArrayList<>();
        if (polled != null) {
            read.addAll(polled);
            done.add(list("poll", reads(polled)));
        }
        OpError error = null;
        try {
            KafkaProducer<byte[], byte[]> p = t();
            try {
                p.beginTransaction();
            } catch (KafkaException e) {
                throw new OpError(describe(e), true, true);
            }
            for (List<Object> m : micro.subList(done.size(), micro.size())) {
                if (m.get(0).equals("send")) {
                    String k = (String) m.get(1);
                    long v = (Long) m.get(2);
                    TopicPartition t = tp(k);
                    try {
                        handles.add(new Object[] {done.size(), p.send(new ProducerRecord<>(t.topic(), t.partition(),
                                null, Long.toString(v).getBytes(StandardCharsets.UTF_8)))});
                    } catch (KafkaException e) {
                        throw new OpError(describe(e), true, true);
                    }
                    done.add(list("send", k, list(-1L, v)));
                } else {
                    List<Rec> records = poll(pollMs);
                    read.addAll(records);
                    done.add(list("poll", reads(records)));
                }
            }
            if (!read.isEmpty() && group != null) {
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (Map.Entry<String, Long> e : nextOffsets(read).entrySet()) {
                    offsets.put(tp(e.getKey()), new OffsetAndMetadata(e.getValue()));
                }
                try {
                    p.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                } catch (KafkaException e) {
                    throw new OpError(describe(e), true, fatal(e));
                }
            }
            if (txnHoldMs > 0) {
                try {
                    p.flush();
                } catch (KafkaException e) {
                    throw new OpError(describe(e), true, fatal(e));
                }
                sleep(txnHoldMs);
            }
        } catch (OpError e) {
            error = e;
        }
        List<Object> value = new ArrayList<>(done);
        for (List<Object> m : micro.subList(done.size(), micro.size())) {  // not run
            value.add(m.get(0).equals("send") ? list("send", m.get(1), list(-1L, m.get(2))) : m);
        }
        if (error != null || abort) {
            if (error != null && error.reset) initTxn(true);
            else txnAbortQuietly();
            Map<String, Object> fields = new LinkedHashMap<>();
            if (!read.isEmpty()) fields.put("rewound", rewind());
            fields.putAll(extra());
            op.complete("fail", value, error != null ? error.getMessage() : "aborted by the workload", fields);
            return;
        }
        try {
            txnCommit();
        } catch (OpError e) {
            if (e.reset) initTxn(true);
            Map<String, Object> fields = new LinkedHashMap<>();
            if (!read.isEmpty()) fields.put("rewound", rewind());
            fields.putAll(extra());
            op.complete(e.definite ? "fail" : "info", value, e.getMessage(), fields);
            return;
        }
        for (Object[] h : handles) {
            @SuppressWarnings("unchecked")
            Future<RecordMetadata> f = (Future<RecordMetadata>) h[1];
            long offset = -1;
            try {
                offset = f.get(0, java.util.concurrent.TimeUnit.MILLISECONDS).offset();
            } catch (Exception e) {
                // not known
            }
            @SuppressWarnings("unchecked")
            List<Object> send = (List<Object>) done.get((Integer) h[0]);
            ((List<Object>) send.get(2)).set(0, offset);
        }
        safe.putAll(nextOffsets(read));
        op.complete("ok", done, null, extra());
    }

    void pollOp() {
        Op op = invoke("poll", list(list("poll")), false);
        List<Rec> records;
        try {
            records = poll(pollMs);
        } catch (OpError e) {
            op.complete("fail", list(list("poll")), e.getMessage(), extra());
            return;
        }
        Map<String, Object> fields = extra();
        Map<String, Long> offsets = nextOffsets(records);
        if (!offsets.isEmpty() && group != null) {
            Map<TopicPartition, OffsetAndMetadata> commit = new HashMap<>();
            for (Map.Entry<String, Long> e : offsets.entrySet()) {
                commit.put(tp(e.getKey()), new OffsetAndMetadata(e.getValue()));
            }
            try {
                consumer.commitSync(commit, Duration.ofMillis((long) (opTimeout * 1000)));
            } catch (KafkaException e) {
                fields.put("commit_error", describe(e));
            }
        }
        safe.putAll(offsets);
        op.complete("ok", list(list("poll", reads(records))), null, fields);
    }

    void sendOp(String k) {
        long value = nextValue++;
        Op op = invoke("send", list(list("send", k, value)), false);
        try {
            long offset = send(k, value);
            op.complete("ok", list(list("send", k, list(offset, value))), null, null);
        } catch (OpError e) {
            op.complete(e.definite ? "fail" : "info", list(list("send", k, list(-1L, value))), e.getMessage(), null);
        }
    }

    void startConsuming(List<String> ks) {
        if (pollMode.equals("subscribe")) {
            List<String> topics = new ArrayList<>(new TreeSet<>(ks.stream().map(k -> tp(k).topic()).toList()));
            Op op = invoke("subscribe", topics, false);
            consumer.subscribe(topics, new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> tps) {
                    if (tps.isEmpty()) return;
                    rebalances.add(list("revoked", keysOf(tps)));
                    for (TopicPartition t : tps) safe.remove(key(t));
                }

                public void onPartitionsAssigned(Collection<TopicPartition> tps) {
                    rebalances.add(list("assigned", keysOf(tps)));
                }

                public void onPartitionsLost(Collection<TopicPartition> tps) {
                    rebalances.add(list("lost", keysOf(tps)));
                    for (TopicPartition t : tps) safe.remove(key(t));
                }
            });
            op.complete("ok", topics, null, null);
        } else {
            assignOp(ks);
        }
    }

    void assignOp(List<String> ks) {
        Op op = invoke("assign", ks, false);
        List<TopicPartition> tps = new ArrayList<>();
        for (String k : ks) tps.add(tp(k));
        consumer.assign(tps);
        safe.clear();
        Map<String, Object> fields = new LinkedHashMap<>();
        fields.put("positions", rewind());
        op.complete("ok", ks, null, fields);
    }

    List<String> subset(List<String> ks) {
        if (pollMode.equals("subscribe")) return ks;
        List<String> copy = new ArrayList<>(ks);
        java.util.Collections.shuffle(copy, rng);
        List<String> out = new ArrayList<>(copy.subList(0, 1 + rng.nextInt(copy.size())));
        out.sort(null);
        return out;
    }

    void ready() {
        if (!stopped) deadline = System.nanoTime() + (long) (duration * 1e9);
    }

    // -- the roles ---------------------------------------------------------------------------
    void queue() {
        openConsumer(true);
        if (txnRatio > 0) initTxn(false);
        else clientMeta(Map.of());
        startConsuming(subset(keys));
        if (pollMode.equals("subscribe")) {  // ready once the group assigned partitions
            long joined = System.nanoTime() + (long) (opTimeout * 1e9);
            while (consumer.assignment().isEmpty() && System.nanoTime() < Math.min(joined, deadline)) pollOp();
        }
        ready();
        for (long n = 1; System.nanoTime() < deadline; n++) {
            if (pollMode.equals("assign") && n % reassignEvery == 0) {
                assignOp(subset(keys));
                continue;
            }
            if (rng.nextDouble() < txnRatio) {
                List<List<Object>> micro = new ArrayList<>();
                int count = 1 + rng.nextInt(maxTxnOps);
                for (int i = 0; i < count; i++) {
                    if (rng.nextDouble() < 0.6) micro.add(list("send", keys.get(rng.nextInt(keys.size())), nextValue++));
                    else micro.add(list("poll"));
                }
                boolean abort = rng.nextDouble() < abortRatio;
                transaction(invoke("txn", micro, true), micro, abort, null);
            } else if (rng.nextDouble() < 0.5) {
                sendOp(keys.get(rng.nextInt(keys.size())));
            } else {
                pollOp();
            }
        }
    }

    void copier() {
        if (input.size() != output.size()) throw new IllegalArgumentException("--input and --output name as many keys");
        Map<String, String> copies = new HashMap<>();
        for (int i = 0; i < input.size(); i++) copies.put(input.get(i), output.get(i));
        openConsumer(true);
        initTxn(false);
        startConsuming(input);
        ready();
        long lastRead = System.nanoTime();
        // after --duration, on until nothing came for --idle-stop-s (caught up)
        while (System.nanoTime() < deadline || (!stopped && System.nanoTime() - lastRead < (long) (idleStopS * 1e9))) {
            long started = System.nanoTime();
            List<Rec> records;
            try {
                records = poll(pollMs);
            } catch (OpError e) {
                continue;
            }
            if (records.isEmpty()) continue;
            lastRead = System.nanoTime();
            List<List<Object>> micro = new ArrayList<>();
            micro.add(list("poll"));
            for (Rec r : records) micro.add(list("send", copies.get(r.key), r.value));
            boolean abort = rng.nextDouble() < abortRatio;
            transaction(new Op("txn", micro, true, started), micro, abort, records);
        }
    }

    void drain() {
        long until = System.nanoTime() + (long) (timeout * 1e9);
        clientMeta(Map.of());
        List<TopicPartition> tps = new ArrayList<>();
        for (String k : keys) tps.add(tp(k));
        Map<TopicPartition, Long> ends = null;
        Properties p = common();
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_uncommitted");
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            while (ends == null) {
                try {
                    ends = c.endOffsets(tps, Duration.ofMillis((long) (opTimeout * 1000)));
                } catch (KafkaException e) {
                    if (System.nanoTime() > until) throw e;
                    sleep(200);
                }
            }
        }
        openConsumer(true);
        Op op = invoke("assign", keys, false);
        consumer.assign(tps);
        consumer.seekToBeginning(tps);
        op.complete("ok", keys, null, null);
        Map<String, Long> reached = new TreeMap<>();
        for (String k : keys) reached.put(k, 0L);
        while (System.nanoTime() < until) {
            boolean all = true;
            for (TopicPartition t : tps) all &= reached.get(key(t)) >= ends.get(t);
            if (all) break;
            long started = System.nanoTime();
            List<Rec> records;
            try {
                records = poll(200);
            } catch (OpError e) {
                records = List.of();
            }
            if (!records.isEmpty()) {
                new Op("poll", list(list("poll")), false, started).complete("ok", list(list("poll", reads(records))), null, null);
            }
            for (Map.Entry<String, Long> e : nextOffsets(records).entrySet()) reached.merge(e.getKey(), e.getValue(), Math::max);
            for (TopicPartition t : tps) {
                if (reached.get(key(t)) < ends.get(t)) {
                    try {
                        reached.merge(key(t), consumer.position(t, Duration.ofMillis((long) (opTimeout * 1000))), Math::max);
                    } catch (KafkaException e) {
                        // keep what was reached
                    }
                }
            }
        }
        Map<String, Object> value = new TreeMap<>();
        for (TopicPartition t : tps) {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("reached", reached.get(key(t)));
            m.put("end", ends.get(t));
            value.put(key(t), m);
        }
        meta("drain_end", value, Map.of());
    }

    // -- main --------------------------------------------------------------------------------
    static List<String> keyList(String text) {
        List<String> out = new ArrayList<>();
        for (String k : text.split(",")) if (!k.isBlank()) out.add(k.strip());
        return out;
    }

    void parse(String[] args) {
        for (int i = 0; i < args.length; i += 2) {
            String flag = args[i];
            if (i + 1 >= args.length) throw new IllegalArgumentException(flag + " needs a value");
            String v = args[i + 1];
            switch (flag) {
                case "--kind" -> {
                    if (!v.equals("java")) throw new IllegalArgumentException("QueueClient is --kind java");
                }
                case "--role" -> role = v;
                case "--process" -> process = v;
                case "--index" -> index = Integer.parseInt(v);
                case "--bootstrap" -> bootstrap = v;
                case "--history" -> historyPath = v;
                case "--seed" -> seed = Long.parseLong(v);
                case "--duration" -> duration = Double.parseDouble(v);
                case "--timeout" -> timeout = Double.parseDouble(v);
                case "--idle-stop-s" -> idleStopS = Double.parseDouble(v);
                case "--keys" -> keys = keyList(v);
                case "--input" -> input = keyList(v);
                case "--output" -> output = keyList(v);
                case "--txn-ratio" -> txnRatio = Double.parseDouble(v);
                case "--abort-ratio" -> abortRatio = Double.parseDouble(v);
                case "--max-txn-ops" -> maxTxnOps = Integer.parseInt(v);
                case "--poll-mode" -> pollMode = v;
                case "--reassign-every" -> reassignEvery = Integer.parseInt(v);
                case "--transactional-id" -> transactionalId = v;
                case "--group" -> group = v;
                case "--poll-ms" -> pollMs = Integer.parseInt(v);
                case "--request-timeout-ms" -> requestTimeoutMs = Integer.parseInt(v);
                case "--transaction-timeout-ms" -> transactionTimeoutMs = Integer.parseInt(v);
                case "--session-timeout-ms" -> sessionTimeoutMs = Integer.parseInt(v);
                case "--op-timeout" -> opTimeout = Double.parseDouble(v);
                case "--txn-hold-ms" -> txnHoldMs = Integer.parseInt(v);
                default -> throw new IllegalArgumentException("unknown flag " + flag);
            }
        }
        if (role == null || process == null || bootstrap == null || historyPath == null) {
            throw new IllegalArgumentException("--role, --process, --bootstrap and --history are required");
        }
        if (index == null) {
            Matcher m = Pattern.compile("(\\d+)$").matcher(process);
            if (!m.find()) throw new IllegalArgumentException("--index: the process name does not end with a number");
            index = Integer.parseInt(m.group(1));
        }
        if (transactionalId == null) transactionalId = process;
        if (group == null && !role.equals("drain")) {  // as resolve() in __main__.py
            group = role.equals("queue") && pollMode.equals("assign") ? transactionalId : role + "-group";
        }
    }

    public static void main(String[] args) throws Exception {
        QueueClient c = new QueueClient();
        c.parse(args);
        c.rng = new Random((c.seed * 1_000_003L) ^ c.process.hashCode());
        c.nextValue = c.index * 1_000_000_000L;
        // until the client is ready (initTransactions retried that long); then ready() moves
        // it to --duration seconds from then
        c.deadline = System.nanoTime() + (long) (Math.max(30, c.duration) * 1e9);
        // SIGTERM: no new operation; the one under way finishes (its completion is written).
        // Still there --op-timeout + 10 s later: halted, its operation left open as a crash
        // leaves it.
        sun.misc.Signal.handle(new sun.misc.Signal("TERM"), sig -> {
            c.stopped = true;
            c.deadline = Long.MIN_VALUE;
            Thread halt = new Thread(() -> {
                sleep((long) (c.opTimeout * 1000) + 10_000);
                Runtime.getRuntime().halt(143);
            });
            halt.setDaemon(true);
            halt.start();
        });
        c.history = new OutputStreamWriter(new FileOutputStream(c.historyPath, true), StandardCharsets.UTF_8);
        try {
            switch (c.role) {
                case "queue" -> c.queue();
                case "copier" -> c.copier();
                case "drain" -> c.drain();
                default -> throw new IllegalArgumentException("--role queue|copier|drain, not " + c.role);
            }
        } finally {
            for (KafkaProducer<byte[], byte[]> p : new ArrayList<>(java.util.Arrays.asList(c.producer, c.txn))) {
                if (p != null) p.close(Duration.ofSeconds(2));
            }
            if (c.consumer != null) c.consumer.close(Duration.ofSeconds(2));
            c.history.close();
        }
        System.exit(0);
    }
}
