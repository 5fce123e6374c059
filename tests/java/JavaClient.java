// Apache Kafka's Java client (kafka-clients 4.x) running the exactly-once scenarios of the
// interop tests, against any broker (oncelog, or a real Kafka beside it):
// tests/test_kafka_java_client.py compiles it with javac against Kafka's jars and runs one JVM
// per group of scenarios. It prints what it did and what it read as JSON lines on stdout (one
// object per line, "event" first); the test decides what is right. Exit 0 unless something
// failed that no scenario expects (then a stack trace on stderr).
//
//   JavaClient eos BOOTSTRAP PREFIX          idempotent produce and read-back; transactions
//                                            committed and aborted; a zombie fenced
//   JavaClient txn BOOTSTRAP PREFIX          the transactions alone
//   JavaClient admin BOOTSTRAP PREFIX        the AdminClient calls, each with its outcome
//   JavaClient copier BOOTSTRAP IN OUT GROUP TXN_ID HOLD_AFTER
//                                            consume-transform-produce: each poll's records
//                                            copied to OUT in one transaction with the offsets
//                                            (sendOffsetsToTransaction with the consumer's
//                                            group metadata); HOLD_AFTER >= 0: after that many
//                                            commits, flush the next transaction and wait
//                                            forever before committing it (to be SIGKILLed)
//   JavaClient read BOOTSTRAP TOPIC ISOLATION...
//                                            every record of TOPIC up to its end, per isolation level
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.DescribeProducersResult;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialDeletion;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class JavaClient {
    static final ObjectMapper JSON = new ObjectMapper();
    static final Duration DEADLINE = Duration.ofSeconds(60);

    public static void main(String[] args) throws Exception {
        String bootstrap = args[1];
        switch (args[0]) {
            case "eos":
                idempotent(bootstrap, args[2] + "-idem");
                transactions(bootstrap, args[2] + "-txn");
                fencing(bootstrap, args[2] + "-fence");
                break;
            case "txn":
                transactions(bootstrap, args[2] + "-txn");
                break;
            case "admin":
                admin(bootstrap, args[2]);
                break;
            case "copier":
                copier(bootstrap, args[2], args[3], args[4], args[5], Integer.parseInt(args[6]));
                break;
            case "read":
                for (int i = 3; i < args.length; i++) {
                    List<Map<String, Object>> records = readAll(bootstrap, args[2], args[i]);
                emit("event", "read", "isolation", args[i], "records", records,
                     "positions", lastPositions, "ends", lastEnds);
                }
                break;
            default:
                throw new IllegalArgumentException("unknown command " + args[0]);
        }
    }

    // -- output ----------------------------------------------------------------------------------

    static synchronized void emit(Object... keysAndValues) throws Exception {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < keysAndValues.length; i += 2) {
            m.put((String) keysAndValues[i], keysAndValues[i + 1]);
        }
        System.out.println(JSON.writeValueAsString(m));
        System.out.flush();
    }

    static Map<String, Object> map(Object... keysAndValues) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < keysAndValues.length; i += 2) {
            m.put((String) keysAndValues[i], keysAndValues[i + 1]);
        }
        return m;
    }

    static String utf8(byte[] b) {
        return b == null ? null : new String(b, StandardCharsets.UTF_8);
    }

    static Map<String, Object> record(ConsumerRecord<String, String> r) {
        List<List<String>> headers = new ArrayList<>();
        for (Header h : r.headers()) {
            headers.add(List.of(h.key(), utf8(h.value())));
        }
        return map("partition", r.partition(), "offset", r.offset(), "key", r.key(),
                   "value", r.value(), "headers", headers);
    }

    /** The class names of an exception and its causes, outermost first. */
    static List<String> chain(Throwable t) {
        List<String> out = new ArrayList<>();
        for (Throwable c = t; c != null && out.size() < 5; c = c.getCause()) {
            out.add(c.getClass().getName() + ": " + c.getMessage());
        }
        return out;
    }

    // -- clients ---------------------------------------------------------------------------------

    static Properties producerProps(String bootstrap, String clientId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, clientId);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return p;
    }

    static KafkaProducer<String, String> transactional(String bootstrap, String txnId,
                                                       String clientId) {
        Properties p = producerProps(bootstrap, clientId);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "30000");
        KafkaProducer<String, String> producer = new KafkaProducer<>(p);
        producer.initTransactions();
        return producer;
    }

    static Properties consumerProps(String bootstrap, String isolation) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG,
              StringDeserializer.class.getName());
        return p;
    }

    // where the last readAll stopped, and the end it had to reach, per partition
    static Map<Integer, Long> lastPositions = new TreeMap<>();
    static Map<Integer, Long> lastEnds = new TreeMap<>();

    /** Every record of every partition of the topic, from the beginning to its end (the last
     *  stable offset for read_committed), partition by partition in offset order. */
    static List<Map<String, Object>> readAll(String bootstrap, String topic, String isolation)
            throws Exception {
        Properties props = consumerProps(bootstrap, isolation);
        props.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");  // closing waits for a fetch
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(props)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo info : c.partitionsFor(topic, DEADLINE)) {
                tps.add(new TopicPartition(topic, info.partition()));
            }
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = c.endOffsets(tps, DEADLINE);
            Map<Integer, List<Map<String, Object>>> byPartition = new TreeMap<>();
            long deadline = System.currentTimeMillis() + DEADLINE.toMillis();
            while (true) {
                boolean done = true;
                for (TopicPartition tp : tps) {
                    done &= c.position(tp, DEADLINE) >= ends.get(tp);
                }
                if (done) {
                    break;
                }
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("could not read " + topic + " to " + ends);
                }
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    if (r.offset() < ends.get(new TopicPartition(topic, r.partition()))) {
                        byPartition.computeIfAbsent(r.partition(), k -> new ArrayList<>())
                            .add(record(r));
                    }
                }
            }
            lastPositions = new TreeMap<>();
            lastEnds = new TreeMap<>();
            for (TopicPartition tp : tps) {
                lastPositions.put(tp.partition(), c.position(tp));
                lastEnds.put(tp.partition(), ends.get(tp));
            }
            List<Map<String, Object>> out = new ArrayList<>();
            byPartition.values().forEach(out::addAll);
            return out;
        }
    }

    static void createTopics(Admin admin, Collection<NewTopic> topics) throws Exception {
        admin.createTopics(topics).all().get();
    }

    // -- 1: idempotent produce and read-back -------------------------------------------------

    static void idempotent(String bootstrap, String topic) throws Exception {
        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG,
                                               bootstrap))) {
            createTopics(admin, List.of(new NewTopic(topic, 3, (short) 1)));
        }
        List<Map<String, Object>> sent = new ArrayList<>();
        try (KafkaProducer<String, String> p =
                 new KafkaProducer<>(producerProps(bootstrap, topic + "-producer"))) {
            List<Future<RecordMetadata>> acks = new ArrayList<>();
            List<ProducerRecord<String, String>> records = new ArrayList<>();
            for (int i = 0; i < 300; i++) {
                RecordHeaders headers = new RecordHeaders();
                headers.add("seq", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
                headers.add("client", "java".getBytes(StandardCharsets.UTF_8));
                ProducerRecord<String, String> r = new ProducerRecord<>(
                    topic, null, "key-" + (i % 17), "value-" + i, headers);
                records.add(r);
                acks.add(p.send(r));
            }
            p.flush();
            for (int i = 0; i < records.size(); i++) {
                RecordMetadata md = acks.get(i).get();
                sent.add(map("partition", md.partition(), "offset", md.offset(),
                             "key", records.get(i).key(), "value", records.get(i).value()));
            }
        }
        emit("event", "idempotent", "topic", topic, "sent", sent,
             "read", readAll(bootstrap, topic, "read_uncommitted"));
    }

    // -- 2: transactions committed and aborted -------------------------------------------------

    static void transactions(String bootstrap, String topic) throws Exception {
        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG,
                                               bootstrap))) {
            createTopics(admin, List.of(new NewTopic(topic, 2, (short) 1)));
        }
        List<String> committed = new ArrayList<>();
        List<String> aborted = new ArrayList<>();
        try (KafkaProducer<String, String> p =
                 transactional(bootstrap, topic + "-id", topic + "-producer")) {
            boolean[] outcomes = {true, false, true, false, true};
            for (int n = 0; n < outcomes.length; n++) {
                p.beginTransaction();
                List<String> values = new ArrayList<>();
                for (int part = 0; part < 2; part++) {
                    for (int i = 0; i < 5; i++) {
                        String v = part + ":" + (n * 10 + i) + (outcomes[n] ? "-c" : "-a");
                        values.add(v);
                        p.send(new ProducerRecord<>(topic, part, "txn-" + n, v));
                    }
                }
                if (outcomes[n]) {
                    p.commitTransaction();
                    committed.addAll(values);
                } else {
                    p.flush();  // the records are in the log, then aborted
                    p.abortTransaction();
                    aborted.addAll(values);
                }
            }
        }
        emit("event", "transactions", "topic", topic, "committed", committed,
             "aborted", aborted,
             "read_committed", readAll(bootstrap, topic, "read_committed"),
             "read_uncommitted", readAll(bootstrap, topic, "read_uncommitted"));
    }

    // -- 4: a zombie fenced by a new instance with the same transactional.id ---------------------

    static void fencing(String bootstrap, String topic) throws Exception {
        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG,
                                               bootstrap))) {
            createTopics(admin, List.of(new NewTopic(topic, 1, (short) 1)));
        }
        String txnId = topic + "-id";
        KafkaProducer<String, String> zombie = transactional(bootstrap, txnId,
                                                             topic + "-zombie");
        zombie.beginTransaction();
        zombie.send(new ProducerRecord<>(topic, 0, "z", "0:0-zombie")).get();
        // the successor's InitProducerId bumps the epoch and aborts the zombie's transaction
        try (KafkaProducer<String, String> successor =
                 transactional(bootstrap, txnId, topic + "-successor")) {
            successor.beginTransaction();
            successor.send(new ProducerRecord<>(topic, 0, "s", "0:1-successor"));
            successor.commitTransaction();
        }
        List<String> sendError = null;
        List<String> commitError = null;
        try {
            zombie.send(new ProducerRecord<>(topic, 0, "z", "0:2-zombie")).get();
        } catch (ExecutionException e) {
            sendError = chain(e.getCause());
        } catch (Exception e) {
            sendError = chain(e);
        }
        try {
            zombie.commitTransaction();
        } catch (Exception e) {
            commitError = chain(e);
        }
        zombie.close(Duration.ofSeconds(5));
        emit("event", "fencing", "topic", topic, "send_error", sendError,
             "commit_error", commitError,
             "read_committed", readAll(bootstrap, topic, "read_committed"),
             "read_uncommitted", readAll(bootstrap, topic, "read_uncommitted"));
    }

    // -- 3: the consume-transform-produce copier -----------------------------------------------

    static void copier(String bootstrap, String in, String out, String group, String txnId,
                       int holdAfter) throws Exception {
        Properties cp = consumerProps(bootstrap, "read_committed");
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        cp.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, group + "-copier");  // static member
        cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "50");
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp);
             KafkaProducer<String, String> producer =
                 transactional(bootstrap, txnId, group + "-producer")) {
            consumer.subscribe(List.of(in));
            List<TopicPartition> inputs = new ArrayList<>();
            for (PartitionInfo info : consumer.partitionsFor(in, DEADLINE)) {
                inputs.add(new TopicPartition(in, info.partition()));
            }
            Map<TopicPartition, Long> ends = consumer.endOffsets(inputs, DEADLINE);
            emit("event", "started", "ends", ends.toString());
            int commits = 0;
            long copied = 0;
            while (true) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    Set<TopicPartition> assigned = consumer.assignment();
                    boolean done = assigned.containsAll(inputs);
                    for (TopicPartition tp : inputs) {
                        done = done && consumer.position(tp, DEADLINE) >= ends.get(tp);
                    }
                    if (done) {
                        emit("event", "done", "commits", commits, "copied", copied);
                        return;
                    }
                    continue;
                }
                producer.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (ConsumerRecord<String, String> r : records) {
                    String value = r.value().replace("in-", "out-");
                    producer.send(new ProducerRecord<>(out, r.partition(), r.key(), value,
                                                       r.headers()));
                    offsets.put(new TopicPartition(r.topic(), r.partition()),
                                new OffsetAndMetadata(r.offset() + 1));
                }
                producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                if (commits == holdAfter) {
                    producer.flush();  // the copies are in the log, uncommitted
                    emit("event", "holding", "records", records.count());
                    System.in.read();  // until killed (stdin stays open)
                    throw new IllegalStateException("stdin closed while holding");
                }
                producer.commitTransaction();
                commits += 1;
                copied += records.count();
                emit("event", "committed", "commits", commits, "copied", copied);
            }
        }
    }

    // -- 5: the AdminClient calls ----------------------------------------------------------------

    static Object outcome(Callable call) {
        try {
            return map("ok", call.call());
        } catch (ExecutionException e) {
            return map("error", e.getCause().getClass().getSimpleName());
        } catch (Exception e) {
            return map("error", e.getClass().getSimpleName());
        }
    }

    interface Callable {
        Object call() throws Exception;
    }

    static Map<String, Object> describeTopic(Admin admin, String topic) throws Exception {
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get()
            .get(topic);
        List<Object> partitions = new ArrayList<>();
        for (TopicPartitionInfo p : d.partitions()) {
            partitions.add(map("partition", p.partition(), "leader", p.leader().id(),
                               "replicas", p.replicas().size(), "isr", p.isr().size()));
        }
        return map("name", d.name(), "internal", d.isInternal(),
                   "topic_id_set", d.topicId() != null && !d.topicId().toString().isEmpty()
                   && d.topicId().getMostSignificantBits() != 0, "partitions", partitions);
    }

    static Map<String, Object> topicConfigs(Admin admin, String topic, String... names)
            throws Exception {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Config config = admin.describeConfigs(List.of(res)).all().get().get(res);
        Map<String, Object> out = new TreeMap<>();
        for (String name : names) {
            ConfigEntry e = config.get(name);
            out.put(name, e == null ? null : map("value", e.value(), "source",
                                                 e.source().toString()));
        }
        return out;
    }

    /** topicConfigs once {@code name} reads {@code value}: Kafka's brokers answer
     *  DescribeConfigs from their copy of the metadata, which follows the controller's commit
     *  of an alteration a moment later (Kafka's own tests wait for it the same way). */
    @SuppressWarnings("unchecked")
    static Map<String, Object> topicConfigsOnce(Admin admin, String topic, String name,
                                                String value, String... names)
            throws Exception {
        long deadline = System.currentTimeMillis() + 15_000;
        while (true) {
            Map<String, Object> out;
            try {
                out = topicConfigs(admin, topic, names);
            } catch (java.util.concurrent.ExecutionException e) {  // the topic not there yet
                if (System.currentTimeMillis() > deadline) {
                    throw e;
                }
                Thread.sleep(100);
                continue;
            }
            Object entry = out.get(name);
            if ((entry != null && value.equals(((Map<String, Object>) entry).get("value")))
                    || System.currentTimeMillis() > deadline) {
                return out;
            }
            Thread.sleep(100);
        }
    }

    static Map<String, Object> offsetsOf(Admin admin, String topic, int partitions,
                                         OffsetSpec spec) throws Exception {
        Map<TopicPartition, OffsetSpec> request = new HashMap<>();
        for (int p = 0; p < partitions; p++) {
            request.put(new TopicPartition(topic, p), spec);
        }
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e :
                 admin.listOffsets(request).all().get().entrySet()) {
            out.put(Integer.toString(e.getKey().partition()), e.getValue().offset());
        }
        return out;
    }

    static void admin(String bootstrap, String prefix) throws Exception {
        String topicA = prefix + "-a";
        String topicB = prefix + "-b";
        String group = prefix + "-group";
        String txnId = prefix + "-txn";
        String user = prefix + "-user";
        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG,
                                               bootstrap))) {
            // topics
            emit("event", "createTopics", "result", outcome(() -> {
                admin.createTopics(List.of(
                    new NewTopic(topicA, 3, (short) 1).configs(Map.of(
                        "retention.ms", "123456789", "cleanup.policy", "delete")),
                    new NewTopic(topicB, 1, (short) 1))).all().get();
                return "created";
            }));
            emit("event", "createTopics again", "result", outcome(() -> {
                admin.createTopics(List.of(new NewTopic(topicA, 3, (short) 1))).all().get();
                return "created";
            }));
            emit("event", "listTopics", "result", outcome(() -> {
                Set<String> names = admin.listTopics().names().get();
                return map("a", names.contains(topicA), "b", names.contains(topicB));
            }));
            emit("event", "describeTopics", "result", outcome(() -> describeTopic(admin, topicA)));
            emit("event", "describeTopics missing", "result",
                 outcome(() -> describeTopic(admin, prefix + "-nonesuch")));
            // configs
            emit("event", "describeConfigs", "result",
                 outcome(() -> topicConfigsOnce(admin, topicA, "retention.ms", "123456789",
                                                "retention.ms", "cleanup.policy",
                                                "segment.bytes")));
            emit("event", "incrementalAlterConfigs", "result", outcome(() -> {
                ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topicA);
                admin.incrementalAlterConfigs(Map.of(res, List.of(
                    new AlterConfigOp(new ConfigEntry("retention.ms", "987654321"),
                                      AlterConfigOp.OpType.SET),
                    new AlterConfigOp(new ConfigEntry("cleanup.policy", ""),
                                      AlterConfigOp.OpType.DELETE),
                    new AlterConfigOp(new ConfigEntry("max.message.bytes", "200000"),
                                      AlterConfigOp.OpType.SET)))).all().get();
                return topicConfigsOnce(admin, topicA, "retention.ms", "987654321",
                                        "retention.ms", "cleanup.policy", "max.message.bytes");
            }));
            emit("event", "incrementalAlterConfigs invalid", "result", outcome(() -> {
                ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topicA);
                admin.incrementalAlterConfigs(Map.of(res, List.of(
                    new AlterConfigOp(new ConfigEntry("retention.ms", "not-a-number"),
                                      AlterConfigOp.OpType.SET)))).all().get();
                return "altered";
            }));
            // records, for the offsets and the group: timestamps an hour old, a second apart
            long base = (System.currentTimeMillis() / 1000 - 3600) * 1000;
            try (KafkaProducer<String, String> p =
                     new KafkaProducer<>(producerProps(bootstrap, prefix + "-producer"))) {
                for (int i = 0; i < 10; i++) {
                    p.send(new ProducerRecord<>(topicA, 0, base + i * 1000L, "k" + i,
                                                "v" + i));
                }
                p.flush();
            }
            emit("event", "listOffsets", "result", outcome(() -> map(
                "earliest", offsetsOf(admin, topicA, 3, OffsetSpec.earliest()),
                "latest", offsetsOf(admin, topicA, 3, OffsetSpec.latest()),
                "max_timestamp", offsetsOf(admin, topicA, 1, OffsetSpec.maxTimestamp()),
                "for_timestamp", offsetsOf(admin, topicA, 1, OffsetSpec.forTimestamp(base + 4500)))));
            // groups: a group with committed offsets and no members
            Properties cp = consumerProps(bootstrap, "read_committed");
            cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
                c.commitSync(Map.of(new TopicPartition(topicA, 0), new OffsetAndMetadata(7, "m"),
                                    new TopicPartition(topicA, 1), new OffsetAndMetadata(0)));
            }
            emit("event", "listConsumerGroups", "result", outcome(() -> {
                for (ConsumerGroupListing g : admin.listConsumerGroups().all().get()) {
                    if (g.groupId().equals(group)) {
                        return map("listed", true, "state", String.valueOf(
                            g.groupState().orElse(null)), "simple", g.isSimpleConsumerGroup());
                    }
                }
                return map("listed", false);
            }));
            emit("event", "describeConsumerGroups", "result", outcome(() -> {
                ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group))
                    .describedGroups().get(group).get();
                return map("state", d.groupState().toString(), "members", d.members().size(),
                           "coordinator_set", d.coordinator() != null);
            }));
            emit("event", "listConsumerGroupOffsets", "result", outcome(() -> {
                Map<String, Object> out = new TreeMap<>();
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
                    .forEach((tp, om) -> out.put(tp.toString(),
                                                 map("offset", om.offset(),
                                                     "metadata", om.metadata())));
                return out;
            }));
            emit("event", "alterConsumerGroupOffsets", "result", outcome(() -> {
                admin.alterConsumerGroupOffsets(group, Map.of(
                    new TopicPartition(topicA, 0), new OffsetAndMetadata(3),
                    new TopicPartition(topicA, 2), new OffsetAndMetadata(0))).all().get();
                Map<String, Object> out = new TreeMap<>();
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
                    .forEach((tp, om) -> out.put(tp.toString(), om.offset()));
                return out;
            }));
            emit("event", "deleteConsumerGroups", "result", outcome(() -> {
                admin.deleteConsumerGroups(List.of(group)).all().get();
                for (ConsumerGroupListing g : admin.listConsumerGroups().all().get()) {
                    if (g.groupId().equals(group)) {
                        return "still listed";
                    }
                }
                return "deleted";
            }));
            emit("event", "deleteConsumerGroups again", "result", outcome(() -> {
                admin.deleteConsumerGroups(List.of(group)).all().get();
                return "deleted";
            }));
            // transactions: one left open while it is described
            try (KafkaProducer<String, String> p =
                     transactional(bootstrap, txnId, prefix + "-txn-producer")) {
                p.beginTransaction();
                p.send(new ProducerRecord<>(topicB, 0, "t", "open")).get();
                emit("event", "listTransactions", "result", outcome(() -> {
                    for (TransactionListing t : admin.listTransactions().all().get()) {
                        if (t.transactionalId().equals(txnId)) {
                            return map("listed", true, "state", t.state().toString(),
                                       "producer_id_set", t.producerId() >= 0);
                        }
                    }
                    return map("listed", false);
                }));
                emit("event", "describeTransactions", "result", outcome(() -> {
                    TransactionDescription d = admin.describeTransactions(List.of(txnId))
                        .description(txnId).get();
                    List<String> tps = new ArrayList<>();
                    d.topicPartitions().forEach(tp -> tps.add(tp.toString()));
                    return map("state", d.state().toString(), "timeout_ms",
                               d.transactionTimeoutMs(), "partitions", tps,
                               "started", d.transactionStartTimeMs().isPresent());
                }));
                emit("event", "describeProducers", "result", outcome(() -> {
                    TopicPartition tp = new TopicPartition(topicB, 0);
                    DescribeProducersResult.PartitionProducerState s =
                        admin.describeProducers(List.of(tp)).partitionResult(tp).get();
                    List<Object> out = new ArrayList<>();
                    for (ProducerState ps : s.activeProducers()) {
                        out.add(map("epoch_set", ps.producerEpoch() >= 0,
                                    "last_sequence", ps.lastSequence(),
                                    "txn_start_offset", ps.currentTransactionStartOffset()
                                        .orElse(-1L)));
                    }
                    return out;
                }));
                p.commitTransaction();
                emit("event", "describeTransactions committed", "result", outcome(() ->
                    admin.describeTransactions(List.of(txnId)).description(txnId).get()
                        .state().toString()));
            }
            // records deleted, partitions added
            emit("event", "deleteRecords", "result", outcome(() -> {
                long low = admin.deleteRecords(Map.of(new TopicPartition(topicA, 0),
                                                      RecordsToDelete.beforeOffset(4)))
                    .lowWatermarks().get(new TopicPartition(topicA, 0)).get().lowWatermark();
                return map("low_watermark", low, "earliest",
                           offsetsOf(admin, topicA, 1, OffsetSpec.earliest()));
            }));
            emit("event", "deleteRecords past the end", "result", outcome(() -> {
                admin.deleteRecords(Map.of(new TopicPartition(topicA, 0),
                                           RecordsToDelete.beforeOffset(99))).all().get();
                return "deleted";
            }));
            emit("event", "createPartitions", "result", outcome(() -> {
                admin.createPartitions(Map.of(topicB, NewPartitions.increaseTo(3))).all().get();
                return ((List<?>) describeTopic(admin, topicB).get("partitions")).size();
            }));
            emit("event", "createPartitions fewer", "result", outcome(() -> {
                admin.createPartitions(Map.of(topicB, NewPartitions.increaseTo(2))).all().get();
                return "created";
            }));
            // SCRAM users: one alteration of a user per request (KRaft's Kafka refuses two
            // for one user in one request: docs/kafka-compatibility.md)
            for (Object[] change : new Object[][] {{ScramMechanism.SCRAM_SHA_256, 8192},
                                                   {ScramMechanism.SCRAM_SHA_512, 4096}}) {
                ScramMechanism mechanism = (ScramMechanism) change[0];
                emit("event", "alterUserScramCredentials " + mechanism.mechanismName(),
                     "result", outcome(() -> {
                    admin.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(
                        user, new ScramCredentialInfo(mechanism, (Integer) change[1]),
                        "secret"))).all().get();
                    return "altered";
                }));
            }
            Callable describeUser = () -> {
                UserScramCredentialsDescription d = admin.describeUserScramCredentials(
                    List.of(user)).description(user).get();
                Map<String, Object> out = new TreeMap<>();
                for (ScramCredentialInfo info : d.credentialInfos()) {
                    out.put(info.mechanism().mechanismName(), info.iterations());
                }
                return out;
            };
            emit("event", "describeUserScramCredentials", "result", outcome(describeUser));
            emit("event", "alterUserScramCredentials delete", "result", outcome(() -> {
                admin.alterUserScramCredentials(List.of(
                    new UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_256)))
                    .all().get();
                return "deleted";
            }));
            emit("event", "describeUserScramCredentials one left", "result",
                 outcome(describeUser));
            emit("event", "alterUserScramCredentials delete missing", "result", outcome(() -> {
                admin.alterUserScramCredentials(List.of(
                    new UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_256)))
                    .all().get();
                return "deleted";
            }));
            emit("event", "alterUserScramCredentials delete last", "result", outcome(() -> {
                admin.alterUserScramCredentials(List.of(
                    new UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)))
                    .all().get();
                return "deleted";
            }));
            emit("event", "describeUserScramCredentials deleted", "result",
                 outcome(describeUser));
        }
    }
}
