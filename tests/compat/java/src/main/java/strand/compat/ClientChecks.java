package strand.compat;

import static strand.compat.Main.check;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.TreeMap;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/** The Java client (kafka-clients): producer, consumer, admin, transactions. */
final class ClientChecks {
    static String C = "java";
    static final int PARTITIONS = 3;
    static final int RECORDS = 30;
    static final int[] IDEMPOTENT_APIS = {22};
    static final int[] TXN_APIS = {22, 24, 26};
    static final int[] CTP_APIS = {22, 24, 25, 26, 28};

    static final String topic = "java-compat-" + Main.RUN_ID;
    static final String group = "java-compat-group-" + Main.RUN_ID;

    /** What the produce step wrote, by partition, in offset order. */
    static final Map<Integer, List<Expected>> produced = new TreeMap<>();
    static final Map<TopicPartition, Long> endOffsets = new HashMap<>();

    record Expected(String key, String value, int index, long offset) {}

    static void runAll() {
        try (Admin admin = admin()) {
            Main.capability(C, "admin", null, () -> adminCheck(admin));
            Main.capability(C, "produce", null, ClientChecks::produce);
            Main.capability(C, "consume-group", null, () -> consumeGroup(admin));
            Main.capability(C, "committed-offsets", null, () -> committedOffsets(admin));
            Main.capability(C, "idempotent", IDEMPOTENT_APIS, () -> idempotent(admin));
            Main.capability(C, "transactions", TXN_APIS, () -> transactions(admin));
            Main.capability(C, "consume-transform-produce", CTP_APIS, () -> consumeTransformProduce(admin));
        }
    }

    // ---------------------------------------------------------------- clients

    static Admin admin() {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, Main.bootstrap);
        p.put(AdminClientConfig.CLIENT_ID_CONFIG, "java-compat-admin");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 30000);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, 15000);
        return Admin.create(p);
    }

    static Properties producerProps(String clientId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, Main.bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, clientId);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, 20000);
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 10000);
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, 20000);
        p.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        return p;
    }

    static KafkaConsumer<String, String> consumer(String groupId, String isolation) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, Main.bootstrap);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "java-compat-consumer");
        if (groupId != null) p.put(ConsumerConfig.GROUP_ID_CONFIG, groupId);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 30000);
        p.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, 15000);
        p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 10000);
        p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 1000);
        return new KafkaConsumer<>(p);
    }

    static void createTopic(Admin admin, String name, int partitions) throws Exception {
        admin.createTopics(List.of(new NewTopic(name, partitions, (short) 1))).all().get(30, TimeUnit.SECONDS);
    }

    /** Polls until `count` records arrived or the deadline passed. */
    static List<ConsumerRecord<String, String>> pollAtLeast(KafkaConsumer<String, String> c, int count, long timeoutMs) {
        List<ConsumerRecord<String, String>> out = new ArrayList<>();
        long deadline = System.currentTimeMillis() + timeoutMs;
        while (out.size() < count && System.currentTimeMillis() < deadline) {
            ConsumerRecords<String, String> rs = c.poll(Duration.ofMillis(500));
            rs.forEach(out::add);
        }
        return out;
    }

    /** Reads a whole topic from the beginning without a group. */
    static List<ConsumerRecord<String, String>> readAll(String t, int partitions, String isolation, int expect, long timeoutMs) {
        try (KafkaConsumer<String, String> c = consumer(null, isolation)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int i = 0; i < partitions; i++) tps.add(new TopicPartition(t, i));
            c.assign(tps);
            c.seekToBeginning(tps);
            List<ConsumerRecord<String, String>> got = pollAtLeast(c, expect, timeoutMs);
            // Linger briefly so extra (unexpected) records are seen too.
            ConsumerRecords<String, String> more = c.poll(Duration.ofMillis(300));
            more.forEach(got::add);
            return got;
        }
    }

    static String header(ConsumerRecord<?, ?> r, String key) {
        Header h = r.headers().lastHeader(key);
        return h == null ? null : new String(h.value(), StandardCharsets.UTF_8);
    }

    // ------------------------------------------------------------- capabilities

    static String adminCheck(Admin admin) throws Exception {
        createTopic(admin, topic, PARTITIONS);
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(30, TimeUnit.SECONDS).get(topic);
        check(d != null, "describeTopics did not return %s", topic);
        check(!d.isInternal(), "topic reported internal");
        check(d.topicId() != null && !d.topicId().equals(Uuid.ZERO_UUID), "topic id missing: %s", d.topicId());
        check(d.partitions().size() == PARTITIONS, "expected %d partitions, got %d", PARTITIONS, d.partitions().size());
        Collection<Node> nodes = admin.describeCluster().nodes().get(30, TimeUnit.SECONDS);
        check(nodes.size() == Main.brokers, "describeCluster: expected %d nodes, got %s", Main.brokers, nodes);
        Set<Integer> nodeIds = new TreeSet<>();
        nodes.forEach(n -> nodeIds.add(n.id()));
        String clusterId = admin.describeCluster().clusterId().get(30, TimeUnit.SECONDS);
        check(clusterId != null && !clusterId.isEmpty(), "no cluster id");
        Set<Integer> leaders = new TreeSet<>();
        for (int i = 0; i < PARTITIONS; i++) {
            TopicPartitionInfo p = d.partitions().get(i);
            check(p.partition() == i, "partition %d listed as %d", i, p.partition());
            check(p.leader() != null && nodeIds.contains(p.leader().id()), "partition %d leader %s, expected one of %s",
                    i, p.leader(), nodeIds);
            check(p.replicas().size() == 1 && p.isr().size() == 1, "partition %d replicas %s isr %s", i, p.replicas(), p.isr());
            leaders.add(p.leader().id());
        }
        // The controller spreads leaders evenly: one partition per broker here.
        int spread = Math.min(Main.brokers, PARTITIONS);
        check(leaders.size() == spread, "leaders %s, expected partitions spread over %d brokers", leaders, spread);
        Set<String> names = admin.listTopics().names().get(30, TimeUnit.SECONDS);
        check(names.contains(topic), "listTopics does not include %s", topic);
        return "created " + topic + " with " + PARTITIONS + " partitions; describe: leaders " + leaders
                + " of brokers " + nodeIds + ", topic id " + d.topicId() + ", cluster " + clusterId;
    }

    static String produce() throws Exception {
        Properties p = producerProps("java-compat-producer");
        // The 4.x default is enable.idempotence=true; the plain capability
        // is the non-idempotent producer (idempotence is its own capability).
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        p.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, 1);
        List<Future<RecordMetadata>> futures = new ArrayList<>();
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(p)) {
            for (int i = 0; i < RECORDS; i++) {
                ProducerRecord<String, String> r = new ProducerRecord<>(topic, "key-" + i, "value-" + i);
                r.headers().add(new RecordHeader("index", Integer.toString(i).getBytes(StandardCharsets.UTF_8)));
                r.headers().add(new RecordHeader("source", "strand-compat-java".getBytes(StandardCharsets.UTF_8)));
                futures.add(prod.send(r));
            }
            prod.flush();
            for (int i = 0; i < RECORDS; i++) {
                RecordMetadata md = futures.get(i).get(30, TimeUnit.SECONDS);
                List<Expected> l = produced.computeIfAbsent(md.partition(), k -> new ArrayList<>());
                long expectOffset = l.size();
                check(md.offset() == expectOffset, "record %d: partition %d offset %d, expected %d",
                        i, md.partition(), md.offset(), expectOffset);
                l.add(new Expected("key-" + i, "value-" + i, i, md.offset()));
            }
        }
        for (var e : produced.entrySet()) endOffsets.put(new TopicPartition(topic, e.getKey()), (long) e.getValue().size());
        check(produced.size() > 1, "all %d keys went to one partition: %s", RECORDS, produced.keySet());
        String codecs = codecs();
        return RECORDS + " keyed records with 2 headers, acks=all, enable.idempotence=false; offsets contiguous per partition "
                + sizes() + "; " + codecs;
    }

    /** Every compression codec of the Java client, written and read back. */
    static String codecs() throws Exception {
        String t = topic + "-codecs";
        String[] codecs = {"gzip", "snappy", "lz4", "zstd"};
        int per = 5;
        List<String> want = new ArrayList<>();
        for (String codec : codecs) {
            Properties p = producerProps("java-compat-" + codec);
            p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
            p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
            p.put(ProducerConfig.LINGER_MS_CONFIG, 50);
            try (KafkaProducer<String, String> prod = new KafkaProducer<>(p)) {
                List<Future<RecordMetadata>> fs = new ArrayList<>();
                for (int i = 0; i < per; i++) {
                    String v = codec + "-" + i + "-" + "x".repeat(200);
                    ProducerRecord<String, String> r = new ProducerRecord<>(t, 0, codec + "-" + i, v);
                    r.headers().add(new RecordHeader("codec", codec.getBytes(StandardCharsets.UTF_8)));
                    fs.add(prod.send(r));
                    want.add(codec + "-" + i + "=" + v + "/" + codec);
                }
                prod.flush();
                for (Future<RecordMetadata> f : fs) f.get(30, TimeUnit.SECONDS);
            }
        }
        List<ConsumerRecord<String, String>> got = readAll(t, 1, "read_uncommitted", want.size(), 20000);
        List<String> seen = new ArrayList<>();
        for (ConsumerRecord<String, String> r : got) seen.add(r.key() + "=" + r.value() + "/" + header(r, "codec"));
        check(seen.equals(want), "compressed batches read back as %d records (expected %d), first mismatch at %s",
                seen.size(), want.size(), firstMismatch(seen, want));
        return String.join("/", codecs) + " batches read back intact";
    }

    static String firstMismatch(List<String> got, List<String> want) {
        for (int i = 0; i < Math.max(got.size(), want.size()); i++) {
            String g = i < got.size() ? got.get(i) : null;
            String w = i < want.size() ? want.get(i) : null;
            if (g == null || !g.equals(w)) return "#" + i + ": got " + g + ", expected " + w;
        }
        return "none";
    }

    static String sizes() {
        StringBuilder sb = new StringBuilder("{");
        for (var e : produced.entrySet()) {
            if (sb.length() > 1) sb.append(",");
            sb.append("p").append(e.getKey()).append("=").append(e.getValue().size());
        }
        return sb.append("}").toString();
    }

    /** Checks consumed records against what the produce step wrote. */
    static void verifyAgainstProduced(List<ConsumerRecord<String, String>> got) {
        check(got.size() == RECORDS, "consumed %d records, expected %d", got.size(), RECORDS);
        Map<Integer, Long> next = new HashMap<>();
        for (ConsumerRecord<String, String> r : got) {
            check(r.topic().equals(topic), "record from topic %s", r.topic());
            List<Expected> exp = produced.get(r.partition());
            check(exp != null, "record on partition %d where nothing was produced", r.partition());
            long want = next.getOrDefault(r.partition(), 0L);
            check(r.offset() == want, "partition %d: offset %d out of order, expected %d", r.partition(), r.offset(), want);
            next.put(r.partition(), want + 1);
            Expected e = exp.get((int) r.offset());
            check(e.key().equals(r.key()), "p%d@%d: key %s, expected %s", r.partition(), r.offset(), r.key(), e.key());
            check(e.value().equals(r.value()), "p%d@%d: value %s, expected %s", r.partition(), r.offset(), r.value(), e.value());
            check(Integer.toString(e.index()).equals(header(r, "index")), "p%d@%d: header index=%s, expected %d",
                    r.partition(), r.offset(), header(r, "index"), e.index());
            check("strand-compat-java".equals(header(r, "source")), "p%d@%d: header source=%s",
                    r.partition(), r.offset(), header(r, "source"));
            check(r.headers().toArray().length == 2, "p%d@%d: %d headers, expected 2", r.partition(), r.offset(),
                    r.headers().toArray().length);
        }
    }

    static String consumeGroup(Admin admin) throws Exception {
        check(!produced.isEmpty(), "nothing was produced (produce failed)");
        try (KafkaConsumer<String, String> c = consumer(group, "read_uncommitted")) {
            c.subscribe(List.of(topic));
            List<ConsumerRecord<String, String>> got = pollAtLeast(c, RECORDS, 45000);
            got.addAll(pollAtLeast(c, 1, 300)); // anything extra?
            verifyAgainstProduced(got);
            Set<TopicPartition> assigned = c.assignment();
            check(assigned.size() == PARTITIONS, "assignment %s, expected all %d partitions", assigned, PARTITIONS);
            ConsumerGroupDescription g = admin.describeConsumerGroups(List.of(group)).all().get(30, TimeUnit.SECONDS).get(group);
            check(g.groupState() == GroupState.STABLE, "group state %s while the consumer is active, expected Stable", g.groupState());
            check(g.members().size() == 1, "group has %d members, expected 1", g.members().size());
            MemberDescription m = g.members().iterator().next();
            check(m.assignment().topicPartitions().equals(assigned), "describeGroups assignment %s, consumer has %s",
                    m.assignment().topicPartitions(), assigned);
            Map<TopicPartition, OffsetAndMetadata> commit = new HashMap<>();
            for (TopicPartition tp : assigned) commit.put(tp, new OffsetAndMetadata(c.position(tp), "compat"));
            c.commitSync(commit, Duration.ofSeconds(30));
        }
        String rebalance = rebalance();
        return "subscribe in group " + group + ": " + RECORDS
                + " records, keys/values/headers/per-partition order match; group Stable with 1 member; commitSync ok; "
                + rebalance;
    }

    /** A second member joins (partitions split) and leaves (all back to the first). */
    static String rebalance() {
        String g = group + "-rebalance";
        TopicPartition[] all = new TopicPartition[PARTITIONS];
        for (int i = 0; i < PARTITIONS; i++) all[i] = new TopicPartition(topic, i);
        try (KafkaConsumer<String, String> c1 = consumer(g, "read_uncommitted")) {
            c1.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 30000;
            while (c1.assignment().size() < PARTITIONS && System.currentTimeMillis() < deadline) c1.poll(Duration.ofMillis(200));
            check(c1.assignment().size() == PARTITIONS, "rebalance: first member got %s", c1.assignment());
            Set<TopicPartition> a1;
            Set<TopicPartition> a2;
            try (KafkaConsumer<String, String> c2 = consumer(g, "read_uncommitted")) {
                c2.subscribe(List.of(topic));
                deadline = System.currentTimeMillis() + 30000;
                while (true) {
                    c2.poll(Duration.ofMillis(100));
                    c1.poll(Duration.ofMillis(100));
                    a1 = c1.assignment();
                    a2 = c2.assignment();
                    Set<TopicPartition> union = new HashSet<>(a1);
                    union.addAll(a2);
                    boolean split = !a1.isEmpty() && !a2.isEmpty() && union.size() == PARTITIONS
                            && a1.size() + a2.size() == PARTITIONS;
                    if (split || System.currentTimeMillis() > deadline) break;
                }
                check(!a1.isEmpty() && !a2.isEmpty() && a1.size() + a2.size() == PARTITIONS,
                        "rebalance: after a second member joined, assignments %s and %s (30 s)", a1, a2);
            }
            deadline = System.currentTimeMillis() + 30000;
            while (c1.assignment().size() < PARTITIONS && System.currentTimeMillis() < deadline) c1.poll(Duration.ofMillis(200));
            check(c1.assignment().size() == PARTITIONS,
                    "rebalance: after the second member left, the first has %s (30 s)", c1.assignment());
            return "rebalance: a second member took " + a2.size() + " of " + PARTITIONS
                    + " partitions and gave them back on leave";
        }
    }

    static String committedOffsets(Admin admin) throws Exception {
        check(!endOffsets.isEmpty(), "nothing was produced (produce failed)");
        Map<TopicPartition, OffsetAndMetadata> viaAdmin = admin.listConsumerGroupOffsets(group)
                .partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
        Map<TopicPartition, Long> want = new HashMap<>();
        for (int i = 0; i < PARTITIONS; i++) {
            TopicPartition tp = new TopicPartition(topic, i);
            want.put(tp, endOffsets.getOrDefault(tp, 0L));
        }
        for (var e : want.entrySet()) {
            OffsetAndMetadata om = viaAdmin.get(e.getKey());
            check(om != null, "admin listConsumerGroupOffsets: no offset for %s (got %s)", e.getKey(), viaAdmin);
            check(om.offset() == e.getValue(), "admin: %s committed %d, expected %d", e.getKey(), om.offset(), e.getValue());
            check("compat".equals(om.metadata()), "admin: %s metadata '%s', expected 'compat'", e.getKey(), om.metadata());
        }
        ConsumerGroupDescription g = admin.describeConsumerGroups(List.of(group)).all().get(30, TimeUnit.SECONDS).get(group);
        check(g.groupState() == GroupState.EMPTY, "group state %s after the consumer left, expected Empty", g.groupState());

        // One more record, then a new member of the group must resume from the
        // committed offsets and see only that record.
        Properties p = producerProps("java-compat-producer-2");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        RecordMetadata md;
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(p)) {
            md = prod.send(new ProducerRecord<>(topic, 0, "key-extra", "value-extra")).get(30, TimeUnit.SECONDS);
        }
        check(md.offset() == want.get(new TopicPartition(topic, 0)), "extra record at offset %d", md.offset());
        try (KafkaConsumer<String, String> c = consumer(group, "read_uncommitted")) {
            c.subscribe(List.of(topic));
            List<ConsumerRecord<String, String>> got = pollAtLeast(c, 1, 45000);
            got.addAll(pollAtLeast(c, 1, 500));
            check(got.size() == 1, "a new group member got %d records, expected only the 1 produced after the commit", got.size());
            ConsumerRecord<String, String> r = got.get(0);
            check(r.partition() == 0 && r.offset() == md.offset() && r.key().equals("key-extra"),
                    "resumed at p%d@%d key %s, expected p0@%d key-extra", r.partition(), r.offset(), r.key(), md.offset());
            Map<TopicPartition, OffsetAndMetadata> viaConsumer = c.committed(new HashSet<>(want.keySet()), Duration.ofSeconds(30));
            for (var e : want.entrySet()) {
                OffsetAndMetadata om = viaConsumer.get(e.getKey());
                check(om != null && om.offset() == e.getValue(), "consumer.committed %s = %s, expected %d",
                        e.getKey(), om, e.getValue());
            }
        }
        return "OffsetFetch via admin and consumer.committed match the consumed positions " + want.values()
                + " with metadata; group Empty after leave; a new member resumed at the committed offset";
    }

    static String idempotent(Admin admin) throws Exception {
        String t = topic + "-idem";
        createTopic(admin, t, 1);
        Properties p = producerProps("java-compat-idempotent");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, 5);
        int n = 20;
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(p)) {
            List<Future<RecordMetadata>> fs = new ArrayList<>();
            for (int i = 0; i < n; i++) fs.add(prod.send(new ProducerRecord<>(t, "k" + i, "v" + i)));
            prod.flush();
            for (int i = 0; i < n; i++) {
                RecordMetadata md = fs.get(i).get(30, TimeUnit.SECONDS);
                check(md.offset() == i, "record %d at offset %d", i, md.offset());
            }
        }
        List<ConsumerRecord<String, String>> got = readAll(t, 1, "read_uncommitted", n, 20000);
        check(got.size() == n, "read back %d records, expected %d", got.size(), n);
        for (int i = 0; i < n; i++) {
            ConsumerRecord<String, String> r = got.get(i);
            check(r.offset() == i && r.key().equals("k" + i) && r.value().equals("v" + i),
                    "record %d read back as %s@%d=%s", i, r.key(), r.offset(), r.value());
        }
        return n + " records with enable.idempotence=true, acks=all, max.in.flight=5; read back exactly once, in order";
    }

    static String transactions(Admin admin) throws Exception {
        String t = topic + "-txn";
        createTopic(admin, t, 1);
        Properties p = producerProps("java-compat-txn");
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "java-compat-txn-" + Main.RUN_ID);
        p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, 30000);
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(p)) {
            prod.initTransactions();
            prod.beginTransaction();
            for (int i = 0; i < 5; i++) prod.send(new ProducerRecord<>(t, "c" + i, "committed-" + i));
            prod.commitTransaction();
            prod.beginTransaction();
            for (int i = 0; i < 3; i++) prod.send(new ProducerRecord<>(t, "a" + i, "aborted-" + i));
            prod.flush();
            prod.abortTransaction();
            prod.beginTransaction();
            for (int i = 5; i < 7; i++) prod.send(new ProducerRecord<>(t, "c" + i, "committed-" + i));
            prod.commitTransaction();
        }
        List<ConsumerRecord<String, String>> committed = readAll(t, 1, "read_committed", 7, 20000);
        List<String> values = new ArrayList<>();
        for (ConsumerRecord<String, String> r : committed) values.add(r.value());
        List<String> want = new ArrayList<>();
        for (int i = 0; i < 7; i++) want.add("committed-" + i);
        check(values.equals(want), "read_committed saw %s, expected %s", values, want);
        List<ConsumerRecord<String, String>> all = readAll(t, 1, "read_uncommitted", 10, 20000);
        check(all.size() == 10, "read_uncommitted saw %d data records, expected 10 (7 committed + 3 aborted)", all.size());
        try (KafkaConsumer<String, String> c = consumer(null, "read_committed")) {
            TopicPartition tp = new TopicPartition(t, 0);
            long end = c.endOffsets(List.of(tp)).get(tp);
            // 10 data records + 3 transaction markers.
            check(end == 13, "read_committed end offset (LSO) %d, expected 13", end);
        }
        return "commit(5), abort(3), commit(2): read_committed saw the 7 committed in order, read_uncommitted 10, LSO 13";
    }

    static String consumeTransformProduce(Admin admin) throws Exception {
        String in = topic + "-ctp-in";
        String out = topic + "-ctp-out";
        String g = group + "-ctp";
        createTopic(admin, in, 2);
        createTopic(admin, out, 1);
        int n = 10;
        Properties pp = producerProps("java-compat-ctp-source");
        pp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(pp)) {
            for (int i = 0; i < n; i++) prod.send(new ProducerRecord<>(in, "k" + i, "word-" + i));
            prod.flush();
        }
        Properties tp = producerProps("java-compat-ctp");
        tp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "java-compat-ctp-" + Main.RUN_ID);
        Map<TopicPartition, Long> inputEnd = new HashMap<>();
        int transformed = 0;
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(tp);
             KafkaConsumer<String, String> c = consumer(g, "read_committed")) {
            prod.initTransactions();
            c.subscribe(List.of(in));
            long deadline = System.currentTimeMillis() + 45000;
            while (transformed < n && System.currentTimeMillis() < deadline) {
                ConsumerRecords<String, String> rs = c.poll(Duration.ofMillis(500));
                if (rs.isEmpty()) continue;
                prod.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (ConsumerRecord<String, String> r : rs) {
                    prod.send(new ProducerRecord<>(out, r.key(), r.value().toUpperCase()));
                    TopicPartition src = new TopicPartition(r.topic(), r.partition());
                    offsets.put(src, new OffsetAndMetadata(r.offset() + 1));
                    inputEnd.put(src, r.offset() + 1);
                    transformed++;
                }
                prod.sendOffsetsToTransaction(offsets, c.groupMetadata());
                prod.commitTransaction();
            }
        }
        check(transformed == n, "transformed %d records, expected %d", transformed, n);
        List<ConsumerRecord<String, String>> got = readAll(out, 1, "read_committed", n, 20000);
        Set<String> values = new HashSet<>();
        for (ConsumerRecord<String, String> r : got) values.add(r.key() + "=" + r.value());
        Set<String> want = new HashSet<>();
        for (int i = 0; i < n; i++) want.add("k" + i + "=WORD-" + i);
        check(got.size() == n && values.equals(want), "output topic read_committed: %s, expected %s", values, want);
        Map<TopicPartition, OffsetAndMetadata> committed = admin.listConsumerGroupOffsets(g)
                .partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
        for (var e : inputEnd.entrySet()) {
            OffsetAndMetadata om = committed.get(e.getKey());
            check(om != null && om.offset() == e.getValue(), "group %s offset for %s = %s, expected %d (from sendOffsetsToTransaction)",
                    g, e.getKey(), om, e.getValue());
        }
        return n + " records consumed in group, transformed and produced in transactions with sendOffsetsToTransaction; "
                + "output read_committed and group offsets " + inputEnd.values() + " match";
    }

    private ClientChecks() {}
}
