package strand.compat;

import static strand.compat.Main.check;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Kafka's own command-line tools, each run as its own JVM exactly like the
 * bin/kafka-*.sh scripts do (same main classes), and their output checked.
 */
final class CliChecks {
    static final String C = "kafka-cli";
    static final String TOPICS = "org.apache.kafka.tools.TopicCommand";
    static final String CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer";
    static final String CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer";
    static final String GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand";
    static final String TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand";

    static final String prefix = "cli-compat-" + Main.RUN_ID;

    static void runAll() {
        Main.capability(C, "topics", null, CliChecks::topics);
        Main.capability(C, "console-produce-consume", null, CliChecks::consoleProduceConsume);
        Main.capability(C, "consumer-groups", null, CliChecks::consumerGroups);
        Main.capability(C, "transactions-cli", new int[] {22, 24, 26, 65, 66}, CliChecks::transactionsCli);
    }

    // ------------------------------------------------------------ processes

    record Run(String tool, int rc, String out, String err) {
        String summary() {
            String e = err.strip();
            // The first lines of stderr that are not log noise.
            List<String> keep = new ArrayList<>();
            for (String l : e.split("\n")) {
                if (l.isBlank() || l.startsWith("\tat ")) continue;
                keep.add(l.strip());
                if (keep.size() == 3) break;
            }
            return tool + " exited " + rc + ": " + String.join(" | ", keep);
        }

        Run ok() {
            check(rc == 0, "%s", summary());
            return this;
        }

        List<String> lines() {
            List<String> l = new ArrayList<>();
            for (String s : out.split("\n")) if (!s.isBlank()) l.add(s);
            return l;
        }
    }

    static Run tool(String mainClass, String stdin, long timeoutSec, String... args) throws Exception {
        List<String> cmd = new ArrayList<>();
        cmd.add(System.getProperty("java.home") + File.separator + "bin" + File.separator + "java");
        cmd.add("-Xshare:auto");
        cmd.add("-XX:TieredStopAtLevel=1");
        cmd.add("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn");
        cmd.add("-cp");
        cmd.add(System.getProperty("java.class.path"));
        cmd.add(mainClass);
        cmd.addAll(Arrays.asList(args));
        File out = File.createTempFile("compat-cli", ".out");
        File err = File.createTempFile("compat-cli", ".err");
        File in = File.createTempFile("compat-cli", ".in");
        try {
            Files.writeString(in.toPath(), stdin == null ? "" : stdin);
            ProcessBuilder pb = new ProcessBuilder(cmd).redirectOutput(out).redirectError(err).redirectInput(in);
            String shortName = mainClass.substring(mainClass.lastIndexOf('.') + 1);
            System.err.println("  $ " + shortName + " " + String.join(" ", args));
            Process p = pb.start();
            if (!p.waitFor(timeoutSec, TimeUnit.SECONDS)) {
                p.destroyForcibly();
                p.waitFor(5, TimeUnit.SECONDS);
                throw new Main.Mismatch(shortName + " " + String.join(" ", args) + " did not finish within " + timeoutSec + " s");
            }
            Run r = new Run(shortName, p.exitValue(), Files.readString(out.toPath(), StandardCharsets.UTF_8),
                    Files.readString(err.toPath(), StandardCharsets.UTF_8));
            if (r.rc != 0) System.err.println("    -> " + r.summary());
            return r;
        } finally {
            out.delete();
            err.delete();
            in.delete();
        }
    }

    /** Whitespace-separated table output: rows as header-name -> value. */
    static List<Map<String, String>> table(String out, String firstHeader) {
        List<Map<String, String>> rows = new ArrayList<>();
        String[] header = null;
        for (String line : out.split("\n")) {
            if (line.isBlank()) continue;
            String[] cols = line.trim().split("\\s+");
            if (cols[0].equals(firstHeader)) {
                header = cols;
                continue;
            }
            if (header == null) continue;
            Map<String, String> row = new HashMap<>();
            for (int i = 0; i < header.length && i < cols.length; i++) row.put(header[i], cols[i]);
            rows.add(row);
        }
        return rows;
    }

    static String bs() {
        return Main.bootstrap;
    }

    // ---------------------------------------------------------- capabilities

    static String topics() throws Exception {
        String t = prefix + "-topics";
        Run create = tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--create", "--topic", t,
                "--partitions", "3", "--replication-factor", "1").ok();
        check(create.out.contains("Created topic " + t + "."), "create printed: %s", create.out.strip());

        Run describe = tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--describe", "--topic", t).ok();
        List<String> lines = describe.lines();
        check(lines.size() == 4, "describe printed %d lines, expected a topic line and 3 partition lines: %s",
                lines.size(), describe.out.strip());
        String head = lines.get(0);
        check(head.startsWith("Topic: " + t + "\t") && head.contains("PartitionCount: 3")
                && head.contains("ReplicationFactor: 1"), "describe topic line: %s", head);
        check(head.contains("TopicId: ") && !head.contains("TopicId: AAAAAAAAAAAAAAAAAAAAAA"), "no topic id: %s", head);
        for (int i = 0; i < 3; i++) {
            String l = lines.get(i + 1).strip();
            check(l.startsWith("Topic: " + t + "\tPartition: " + i + "\tLeader: 1\tReplicas: 1\tIsr: 1"),
                    "describe partition line %d: %s", i, l);
        }

        Run alter = tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--alter", "--topic", t, "--partitions", "4").ok();
        Run describe2 = tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--describe", "--topic", t).ok();
        check(describe2.out.contains("PartitionCount: 4") && describe2.out.contains("Partition: 3\tLeader: 1"),
                "after --alter --partitions 4: %s", describe2.out.strip());

        Run list = tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--list").ok();
        check(list.lines().contains(t), "--list does not show %s: %s", t, list.out.strip());

        tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--delete", "--topic", t).ok();
        long deadline = System.currentTimeMillis() + 15000;
        boolean gone = false;
        while (!gone && System.currentTimeMillis() < deadline) {
            Run l = tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--list").ok();
            gone = !l.lines().contains(t);
            if (!gone) Thread.sleep(500);
        }
        check(gone, "%s still listed 15 s after --delete", t);
        Run after = tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--describe", "--topic", t);
        check(after.rc != 0 && (after.out + after.err).contains("does not exist"),
                "describe of the deleted topic: rc %d, %s", after.rc, (after.out + after.err).strip());
        return "create (3 partitions), describe (Leader: 1 Replicas: 1 Isr: 1, topic id), alter to 4 partitions, list, "
                + "delete (gone from list; describe says it does not exist)";
    }

    static String consoleProduceConsume() throws Exception {
        String t = prefix + "-console";
        String g = prefix + "-console-group";
        tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--create", "--topic", t,
                "--partitions", "1", "--replication-factor", "1").ok();
        int n = 10;
        StringBuilder input = new StringBuilder();
        List<String> expected = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            input.append("src:cli,n:").append(i).append('\t').append("key-").append(i).append(':').append("value ").append(i).append('\n');
            expected.add("src:cli,n:" + i + ":key-" + i + ":value " + i);
        }
        String[] common = {"--bootstrap-server", bs(), "--topic", t, "--property", "parse.key=true",
                "--property", "key.separator=:", "--property", "parse.headers=true", "--producer-property", "acks=all"};
        // First as an operator types it: the 4.x producer defaults to idempotence.
        Run def = tool(CONSOLE_PRODUCER, input.toString(), 90, common);
        String gapNote = null;
        if (def.rc != 0) {
            String missing = Main.missing(new int[] {22});
            check(!missing.isEmpty() && def.err.contains("INIT_PRODUCER_ID"),
                    "console producer with default settings: %s", def.summary());
            String cause = def.err.lines().filter(l -> l.contains("UnsupportedVersionException"))
                    .map(l -> l.substring(l.indexOf("UnsupportedVersionException"))).findFirst().orElse(def.summary());
            gapNote = missing + " not supported by the broker: the default console producer (enable.idempotence=true) exits "
                    + def.rc + " with " + cause;
            String[] nonIdem = Arrays.copyOf(common, common.length + 2);
            nonIdem[common.length] = "--producer-property";
            nonIdem[common.length + 1] = "enable.idempotence=false";
            tool(CONSOLE_PRODUCER, input.toString(), 90, nonIdem).ok();
        }
        Run cons = tool(CONSOLE_CONSUMER, null, 90, "--bootstrap-server", bs(), "--topic", t, "--group", g,
                "--from-beginning", "--max-messages", Integer.toString(n), "--timeout-ms", "20000",
                "--property", "print.key=true", "--property", "key.separator=:", "--property", "print.headers=true").ok();
        List<String> got = cons.lines();
        check(got.equals(expected), "console consumer printed %s, expected %s", got, expected);
        check(cons.err.contains("Processed a total of " + n + " messages"), "console consumer stderr: %s", cons.err.strip());
        String passDetail = n + " lines with key and 2 headers, acks=all, console producer -> console consumer --group: "
                + "same lines, same order";
        if (gapNote != null) {
            // The round trip works but only with an override an operator would
            // not know to type: a gap until the broker serves InitProducerId.
            throw new GapWithPass(gapNote + "; with --producer-property enable.idempotence=false it passes: " + passDetail);
        }
        return passDetail + " (default idempotent producer)";
    }

    /** The capability worked only around a missing broker API. */
    static final class GapWithPass extends RuntimeException {
        GapWithPass(String msg) { super(msg); }
    }

    static String consumerGroups() throws Exception {
        String t = prefix + "-groups";
        String g = prefix + "-groups-group";
        tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--create", "--topic", t,
                "--partitions", "2", "--replication-factor", "1").ok();
        int n = 12;
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bs());
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, 20000);
        Map<String, Long> leo = new HashMap<>();
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(p)) {
            for (int i = 0; i < n; i++) {
                int part = i < 5 ? 0 : 1; // 5 on partition 0, 7 on partition 1
                prod.send(new ProducerRecord<>(t, part, "k" + i, "v" + i)).get(30, TimeUnit.SECONDS);
                leo.merge(Integer.toString(part), 1L, Long::sum);
            }
        }
        tool(CONSOLE_CONSUMER, null, 90, "--bootstrap-server", bs(), "--topic", t, "--group", g,
                "--from-beginning", "--max-messages", Integer.toString(n), "--timeout-ms", "20000").ok();

        Run list = tool(GROUPS, null, 60, "--bootstrap-server", bs(), "--list").ok();
        check(list.lines().contains(g), "--list does not show %s: %s", g, list.out.strip());

        Run desc = tool(GROUPS, null, 60, "--bootstrap-server", bs(), "--describe", "--group", g).ok();
        List<Map<String, String>> rows = table(desc.out, "GROUP");
        check(rows.size() == 2, "describe: %d partition rows, expected 2: %s", rows.size(), desc.out.strip());
        for (Map<String, String> r : rows) {
            String part = r.get("PARTITION");
            check(g.equals(r.get("GROUP")) && t.equals(r.get("TOPIC")), "describe row %s", r);
            String want = Long.toString(leo.get(part));
            check(want.equals(r.get("CURRENT-OFFSET")) && want.equals(r.get("LOG-END-OFFSET")) && "0".equals(r.get("LAG")),
                    "describe partition %s: current %s log-end %s lag %s, expected %s/%s/0",
                    part, r.get("CURRENT-OFFSET"), r.get("LOG-END-OFFSET"), r.get("LAG"), want, want);
        }
        Run state = tool(GROUPS, null, 60, "--bootstrap-server", bs(), "--describe", "--group", g, "--state").ok();
        List<Map<String, String>> st = table(state.out, "GROUP");
        check(st.size() == 1 && "Empty".equals(st.get(0).get("STATE")) && state.out.contains("(1)"),
                "describe --state: %s", state.out.strip());

        Run reset = tool(GROUPS, null, 60, "--bootstrap-server", bs(), "--reset-offsets", "--group", g, "--topic", t,
                "--to-earliest", "--execute").ok();
        List<Map<String, String>> rr = table(reset.out, "GROUP");
        check(rr.size() == 2 && rr.stream().allMatch(r -> "0".equals(r.get("NEW-OFFSET"))),
                "reset-offsets --to-earliest --execute printed: %s", reset.out.strip());
        Run desc2 = tool(GROUPS, null, 60, "--bootstrap-server", bs(), "--describe", "--group", g).ok();
        List<Map<String, String>> rows2 = table(desc2.out, "GROUP");
        check(rows2.size() == 2, "describe after reset: %s", desc2.out.strip());
        for (Map<String, String> r : rows2) {
            String want = Long.toString(leo.get(r.get("PARTITION")));
            check("0".equals(r.get("CURRENT-OFFSET")) && want.equals(r.get("LAG")),
                    "after reset, partition %s: current %s lag %s, expected 0/%s", r.get("PARTITION"),
                    r.get("CURRENT-OFFSET"), r.get("LAG"), want);
        }
        Run del = tool(GROUPS, null, 60, "--bootstrap-server", bs(), "--delete", "--group", g).ok();
        check(del.out.contains("Deletion of requested consumer groups ('" + g + "') was successful."),
                "--delete printed: %s", del.out.strip());
        Run list2 = tool(GROUPS, null, 60, "--bootstrap-server", bs(), "--list").ok();
        check(!list2.lines().contains(g), "%s still listed after --delete", g);
        return "list; describe shows committed offsets " + leo + " with lag 0 after a console consumer; --state Empty; "
                + "reset-offsets --to-earliest --execute then describe shows offset 0 and full lag; delete";
    }

    static String transactionsCli() throws Exception {
        String txnId = prefix + "-txn";
        String t = prefix + "-txn-topic";
        tool(TRANSACTIONS, null, 60, "--bootstrap-server", bs(), "list").ok();
        tool(TOPICS, null, 60, "--bootstrap-server", bs(), "--create", "--topic", t,
                "--partitions", "1", "--replication-factor", "1").ok();
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bs());
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, 20000);
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(p)) {
            prod.initTransactions();
            prod.beginTransaction();
            prod.send(new ProducerRecord<>(t, "k", "v"));
            prod.commitTransaction();
        }
        Run list = tool(TRANSACTIONS, null, 60, "--bootstrap-server", bs(), "list").ok();
        List<Map<String, String>> rows = table(list.out, "TransactionalId");
        Map<String, String> mine = rows.stream().filter(r -> txnId.equals(r.get("TransactionalId"))).findFirst().orElse(null);
        check(mine != null, "list does not show %s: %s", txnId, list.out.strip());
        check("1".equals(mine.get("Coordinator")), "list: coordinator %s, expected 1", mine.get("Coordinator"));
        Run desc = tool(TRANSACTIONS, null, 60, "--bootstrap-server", bs(), "describe", "--transactional-id", txnId).ok();
        List<Map<String, String>> d = table(desc.out, "CoordinatorId");
        check(d.size() == 1, "describe printed: %s", desc.out.strip());
        Map<String, String> r = d.get(0);
        check(txnId.equals(r.get("TransactionalId")) && "CompleteCommit".equals(r.get("TransactionState")),
                "describe: %s", r);
        check(r.get("ProducerId") != null && Long.parseLong(r.get("ProducerId")) >= 0, "describe producer id %s", r.get("ProducerId"));
        return "list shows " + txnId + " on coordinator 1 (state " + mine.get("TransactionState") + "); describe: producer id "
                + r.get("ProducerId") + " epoch " + r.get("ProducerEpoch") + ", CompleteCommit";
    }

    private CliChecks() {}
}
