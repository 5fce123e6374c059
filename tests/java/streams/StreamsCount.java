// A Kafka Streams application with processing.guarantee=exactly_once_v2, for
// tests/test_kafka_streams.py: it counts the input's records by their VALUE (a key other than the
// input's key, so Streams repartitions through an internal topic, which it purges with
// DeleteRecords), into a persistent RocksDB store (backed by a compacted changelog topic), and
// writes every update of a count to the output topic (key: the value counted, value: the count as
// a decimal string). Caching is off (statestore.cache.max.bytes=0), so each input record gives
// exactly one update: a key's counts in the output are 1, 2, ..., n.
//
//   java -cp KAFKA_JARS:DIR StreamsCount BOOTSTRAP APP_ID INPUT OUTPUT STATE_DIR [DELAY_MS [NAME=VALUE...]]
//
// DELAY_MS (default 0) slows each count's update down, so that a test can kill the application mid-run.
// NAME=VALUE pairs are further Streams configs (group.protocol=streams, ...).
// The application prints "STATE RUNNING" (and every other state it enters) on stdout, and runs
// until it is killed (or gets SIGTERM, which closes it and leaves the group).
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

public final class StreamsCount {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], appId = args[1], input = args[2], output = args[3];
        String stateDir = args[4];
        long delayMs = args.length > 5 ? Long.parseLong(args[5]) : 0L;

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        // Purge the repartition topic at every commit, not every 30 s.
        props.put(StreamsConfig.REPARTITION_PURGE_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        // A static member (KIP-345): a restarted instance takes its place in the group back at
        // once, without waiting for the killed one's session to time out.
        props.put(StreamsConfig.consumerPrefix("group.instance.id"), appId + "-instance");
        props.put(StreamsConfig.consumerPrefix("session.timeout.ms"), 6000);
        props.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), 500);
        // A killed instance's open transaction is aborted by the coordinator after this long
        // when the restart does not fence it (a new process id, on an empty state directory).
        props.put(StreamsConfig.producerPrefix("transaction.timeout.ms"), 5000);
        // Each record goes to the broker at once (not at the commit, after Streams' 100 ms
        // linger): a kill then finds records of an open transaction there, which must be aborted.
        props.put(StreamsConfig.producerPrefix("linger.ms"), 0);
        for (int i = 6; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .groupBy((k, v) -> v, Grouped.with("by-value", Serdes.String(), Serdes.String()))
            .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts")
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()))
            .toStream()
            .peek((k, n) -> {  // in the counting task, after the repartition topic
                if (delayMs > 0) {
                    try {
                        Thread.sleep(delayMs);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                }
            })
            .map((k, n) -> KeyValue.pair(k, Long.toString(n)))
            .to(output, Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch done = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("STATE " + now);
            System.out.flush();
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                done.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            System.out.println("UNCAUGHT " + e);
            System.out.flush();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
                .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        // SIGTERM closes it, and its static member leaves the group (KIP-1153: LeaveGroup by
        // group.instance.id), so that kafka-streams-application-reset finds the group empty.
        CloseOptions leave = CloseOptions
            .groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
            .withTimeout(Duration.ofSeconds(10));
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(leave);
            done.countDown();
        }));
        streams.start();
        done.await();
        streams.close(leave);
        System.exit(streams.state() == KafkaStreams.State.ERROR ? 1 : 0);
    }
}
