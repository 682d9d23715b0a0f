package strand.compat;

import static strand.compat.CliChecks.bs;
import static strand.compat.CliChecks.tool;
import static strand.compat.Main.check;

import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.common.config.ConfigResource;

/**
 * Kafka's cluster tools against a three-broker Strand cluster, bootstrapped
 * from one broker: kafka-metadata-quorum, kafka-topics --describe,
 * kafka-cluster cluster-id and kafka-features describe.
 */
final class ClusterCliChecks {
    static final String C = "kafka-cli-cluster";
    static final String[] CAPABILITIES = {"metadata-quorum", "topics-leaders", "replica-assignment", "leader-election", "reassign-partitions", "cluster-id", "features"};
    static final String QUORUM = "org.apache.kafka.tools.MetadataQuorumCommand";
    static final String CLUSTER = "org.apache.kafka.tools.ClusterTool";
    static final String FEATURES = "org.apache.kafka.tools.FeatureCommand";
    static final String ELECTION = "org.apache.kafka.tools.LeaderElectionCommand";
    static final String REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand";

    static void runAll() {
        Main.capability(C, "metadata-quorum", new int[] {55}, ClusterCliChecks::metadataQuorum);
        Main.capability(C, "topics-leaders", null, ClusterCliChecks::topicsLeaders);
        Main.capability(C, "replica-assignment", null, ClusterCliChecks::replicaAssignment);
        Main.capability(C, "leader-election", new int[] {43}, ClusterCliChecks::leaderElection);
        Main.capability(C, "reassign-partitions", new int[] {45, 46}, ClusterCliChecks::reassignPartitions);
        Main.capability(C, "cluster-id", null, ClusterCliChecks::clusterId);
        Main.capability(C, "features", null, ClusterCliChecks::features);
    }

    /** `Key:   value` lines as a map. */
    static Map<String, String> fields(String out) {
        Map<String, String> m = new java.util.HashMap<>();
        for (String line : out.split("\n")) {
            int colon = line.indexOf(':');
            if (colon > 0) m.put(line.substring(0, colon).trim(), line.substring(colon + 1).trim());
        }
        return m;
    }

    static String metadataQuorum() throws Exception {
        CliChecks.Run status = tool(QUORUM, null, 60, "--bootstrap-server", bs(), "describe", "--status").ok();
        Map<String, String> f = fields(status.out());
        int leader = Integer.parseInt(f.getOrDefault("LeaderId", "-1"));
        check(leader >= 1 && leader <= Main.brokers, "LeaderId %s: %s", leader, status.out().strip());
        long hw = Long.parseLong(f.getOrDefault("HighWatermark", "-1"));
        check(hw > 0, "HighWatermark %d: %s", hw, status.out().strip());
        String voters = f.getOrDefault("CurrentVoters", "");
        Set<Integer> ids = new TreeSet<>();
        Matcher m = Pattern.compile("\"id\":\\s*(\\d+)").matcher(voters);
        while (m.find()) ids.add(Integer.parseInt(m.group(1)));
        if (ids.isEmpty()) {
            // Older output: CurrentVoters: [1,2,3]
            Matcher plain = Pattern.compile("(\\d+)").matcher(voters);
            while (plain.find()) ids.add(Integer.parseInt(plain.group(1)));
        }
        check(ids.size() == Main.brokers, "CurrentVoters %s: %s", voters, status.out().strip());

        CliChecks.Run repl = tool(QUORUM, null, 60, "--bootstrap-server", bs(), "describe", "--replication").ok();
        List<Map<String, String>> rows = CliChecks.table(repl.out(), "NodeId");
        check(rows.size() == Main.brokers, "--replication printed %d rows, expected %d: %s", rows.size(), Main.brokers,
                repl.out().strip());
        long leaders = rows.stream().filter(r -> "Leader".equals(r.get("Status"))).count();
        long followers = rows.stream().filter(r -> "Follower".equals(r.get("Status"))).count();
        check(leaders == 1 && followers == Main.brokers - 1, "statuses: %s", repl.out().strip());
        for (Map<String, String> r : rows) {
            long end = Long.parseLong(r.getOrDefault("LogEndOffset", "-1"));
            check(end > 0, "node %s log end offset %d: %s", r.get("NodeId"), end, repl.out().strip());
        }
        return "--status: leader " + leader + ", high watermark " + hw + ", voters " + ids
                + "; --replication: 1 leader and " + followers + " followers with log end offsets";
    }

    static String topicsLeaders() throws Exception {
        String t = CliChecks.prefix + "-cluster-topics";
        tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--create", "--topic", t,
                "--partitions", "6", "--replication-factor", "1").ok();
        CliChecks.Run describe = tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--describe", "--topic", t).ok();
        Set<Integer> leaders = new TreeSet<>();
        Matcher m = Pattern.compile("Partition: (\\d+)\\tLeader: (\\d+)\\tReplicas: (\\d+)\\tIsr: (\\d+)").matcher(describe.out());
        int partitions = 0;
        while (m.find()) {
            partitions++;
            check(m.group(2).equals(m.group(3)) && m.group(2).equals(m.group(4)),
                    "partition %s: leader %s replicas %s isr %s", m.group(1), m.group(2), m.group(3), m.group(4));
            leaders.add(Integer.parseInt(m.group(2)));
        }
        check(partitions == 6, "describe listed %d partitions: %s", partitions, describe.out().strip());
        check(leaders.size() == Main.brokers, "leaders %s, expected all %d brokers: %s", leaders, Main.brokers,
                describe.out().strip());
        tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--delete", "--topic", t).ok();
        return "6 partitions led by brokers " + leaders;
    }

    /** kafka-topics --create --replica-assignment: each partition led where it was placed. */
    static String replicaAssignment() throws Exception {
        String t = CliChecks.prefix + "-cluster-assigned";
        // Partition p on broker (p mod brokers) + 1, backwards: Main.brokers, ..., 1.
        List<Integer> wanted = new java.util.ArrayList<>();
        for (int p = 0; p < 2 * Main.brokers; p++) wanted.add(Main.brokers - p % Main.brokers);
        String spec = String.join(",", wanted.stream().map(String::valueOf).toList());
        tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--create", "--topic", t,
                "--replica-assignment", spec).ok();
        CliChecks.Run describe = tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--describe", "--topic", t).ok();
        Matcher m = Pattern.compile("Partition: (\\d+)\\tLeader: (\\d+)\\tReplicas: (\\d+)").matcher(describe.out());
        Map<Integer, Integer> seen = new java.util.TreeMap<>();
        while (m.find()) {
            check(m.group(2).equals(m.group(3)), "partition %s: leader %s replicas %s", m.group(1), m.group(2), m.group(3));
            seen.put(Integer.parseInt(m.group(1)), Integer.parseInt(m.group(2)));
        }
        check(seen.size() == wanted.size(), "describe listed %d partitions: %s", seen.size(), describe.out().strip());
        for (int p = 0; p < wanted.size(); p++) {
            check(wanted.get(p).equals(seen.get(p)), "partition %d led by %s, assigned to %d: %s", p, seen.get(p),
                    wanted.get(p), describe.out().strip());
        }
        CliChecks.Run bad = tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--create", "--topic",
                t + "-bad", "--replica-assignment", "1," + (Main.brokers + 50));
        String said = bad.out() + bad.err();
        check(bad.rc() != 0 && said.contains("InvalidReplicaAssignment"),
                "an assignment to an unknown broker: %s", bad.summary());
        tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--delete", "--topic", t).ok();
        return "--replica-assignment " + spec + " led as assigned; an unknown broker refused (InvalidReplicaAssignment)";
    }

    /**
     * kafka-leader-election on partitions of three replicas led by their
     * preferred replica: nothing to elect (PREFERRED or UNCLEAN), and an
     * unknown partition refused. (Moving a leader back needs a broker
     * restart; tests/replication.rs does that through the same API.)
     */
    static String leaderElection() throws Exception {
        String t = CliChecks.prefix + "-cluster-election";
        tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--create", "--topic", t,
                "--partitions", "2", "--replication-factor", "3").ok();
        String describeOut = "";
        for (int i = 0; i < 100; i++) {
            describeOut = tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--describe", "--topic", t).ok().out();
            Matcher m = Pattern.compile("Leader: (\\d+)\tReplicas: (\\d+),\\d+,\\d+\tIsr: \\d+,\\d+,\\d+").matcher(describeOut);
            int led = 0;
            while (m.find()) if (m.group(1).equals(m.group(2))) led++;
            if (led == 2) break;
            Thread.sleep(100);
        }
        for (String type : new String[] {"preferred", "unclean"}) {
            CliChecks.Run r = tool(ELECTION, null, 60, "--bootstrap-server", bs(), "--election-type", type,
                    "--topic", t, "--partition", "0").ok();
            check(r.out().contains("Valid replica already elected for partitions " + t + "-0"),
                    "--election-type %s on a partition its preferred replica leads: %s (topic: %s)", type,
                    r.summary(), describeOut.strip());
        }
        CliChecks.Run all = tool(ELECTION, null, 60, "--bootstrap-server", bs(), "--election-type", "preferred",
                "--all-topic-partitions").ok();
        check(!all.out().contains(t + "-"), "--all-topic-partitions named a balanced partition: %s", all.summary());
        CliChecks.Run unknown = tool(ELECTION, null, 60, "--bootstrap-server", bs(), "--election-type", "preferred",
                "--topic", t, "--partition", "9");
        String said = unknown.out() + unknown.err();
        check(unknown.rc() != 0 && said.contains("UnknownTopicOrPartition"), "an unknown partition: %s",
                unknown.summary());
        tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--delete", "--topic", t).ok();
        return "preferred and unclean elections of a balanced partition: \"Valid replica already elected\"; "
                + "--all-topic-partitions: nothing to elect; an unknown partition refused (UnknownTopicOrPartition)";
    }

    /** The Replicas and Isr columns of kafka-topics --describe for partition 0 of `t`. */
    static String[] replicasAndIsr(String t) throws Exception {
        String out = tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--describe", "--topic", t).ok().out();
        Matcher m = Pattern.compile("Partition: 0\tLeader: (-?\\d+)\tReplicas: ([\\d,]+)\tIsr: ([\\d,]*)").matcher(out);
        check(m.find(), "describe of %s: %s", t, out.strip());
        return new String[] {m.group(1), m.group(2), m.group(3)};
    }

    /**
     * kafka-reassign-partitions --generate, --execute, --verify (until
     * complete, which also deletes the replication throttles it might have
     * set) and --list: the replica of broker 1, the leader's, moves to broker
     * 3 (the partition then led by the target, both replicas in sync), with
     * the records produced before it readable after; a target naming an
     * unknown broker is refused.
     */
    static String reassignPartitions() throws Exception {
        String t = CliChecks.prefix + "-cluster-reassign";
        tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--create", "--topic", t,
                "--replica-assignment", "1:2").ok();
        StringBuilder lines = new StringBuilder();
        for (int i = 0; i < 20; i++) lines.append("moved-").append(i).append('\n');
        tool(CliChecks.CONSOLE_PRODUCER, lines.toString(), 60, "--bootstrap-server", bs(), "--topic", t,
                "--producer-property", "acks=all").ok();

        java.nio.file.Path topicsFile = java.nio.file.Files.createTempFile("reassign-topics", ".json");
        java.nio.file.Files.writeString(topicsFile, "{\"version\":1,\"topics\":[{\"topic\":\"" + t + "\"}]}");
        CliChecks.Run generated = tool(REASSIGN, null, 60, "--bootstrap-server", bs(), "--generate",
                "--topics-to-move-json-file", topicsFile.toString(), "--broker-list", "2,3").ok();
        check(generated.out().contains("Current partition replica assignment")
                && generated.out().contains("Proposed partition reassignment configuration")
                && generated.out().contains("\"replicas\":[1,2]"), "--generate printed: %s", generated.summary());

        java.nio.file.Path plan = java.nio.file.Files.createTempFile("reassign-plan", ".json");
        java.nio.file.Files.writeString(plan, "{\"version\":1,\"partitions\":[{\"topic\":\"" + t
                + "\",\"partition\":0,\"replicas\":[3,2],\"log_dirs\":[\"any\",\"any\"]}]}");
        CliChecks.Run executed = tool(REASSIGN, null, 60, "--bootstrap-server", bs(), "--execute",
                "--reassignment-json-file", plan.toString(), "--throttle", "50000000").ok();
        check(executed.out().contains("Successfully started partition reassignment")
                && executed.out().contains("The inter-broker throttle limit was set to 50000000 B/s"),
                "--execute --throttle printed: %s", executed.summary());
        // The tool throttles the current replicas as leaders and the new one as follower, on every broker involved.
        String leaders = configValue(ConfigResource.Type.TOPIC, t, "leader.replication.throttled.replicas");
        String followers = configValue(ConfigResource.Type.TOPIC, t, "follower.replication.throttled.replicas");
        check(Set.of(leaders.split(",")).equals(Set.of("0:1", "0:2")) && followers.equals("0:3"),
                "throttled replicas after --execute --throttle: leader %s, follower %s", leaders, followers);
        for (String b : new String[] {"1", "2", "3"}) {
            for (String key : new String[] {"leader.replication.throttled.rate", "follower.replication.throttled.rate"}) {
                String rate = configValue(ConfigResource.Type.BROKER, b, key);
                check("50000000".equals(rate), "broker %s %s after --execute --throttle: %s", b, key, rate);
            }
        }
        CliChecks.Run verified = null;
        for (int i = 0; i < 300; i++) {
            verified = tool(REASSIGN, null, 60, "--bootstrap-server", bs(), "--verify", "--reassignment-json-file",
                    plan.toString());
            if (verified.rc() == 0 && verified.out().contains("Reassignment of partition " + t + "-0 is completed")) break;
            Thread.sleep(100);
        }
        check(verified.rc() == 0 && verified.out().contains("Reassignment of partition " + t + "-0 is completed"),
                "--verify never saw the move complete: %s", verified.summary());
        // --verify, the move complete, removes the throttles it set.
        String left = configValue(ConfigResource.Type.TOPIC, t, "leader.replication.throttled.replicas");
        String rateLeft = configValue(ConfigResource.Type.BROKER, "3", "follower.replication.throttled.rate");
        check(left.isEmpty() && !"50000000".equals(rateLeft), "throttles left after --verify: replicas %s, rate %s",
                left, rateLeft);
        String[] after = replicasAndIsr(t);
        Set<String> isr = new TreeSet<>(List.of(after[2].split(",")));
        check(after[0].equals("3") && after[1].equals("3,2") && isr.equals(Set.of("2", "3")),
                "after the move: leader %s, replicas %s, isr %s", after[0], after[1], after[2]);
        CliChecks.Run listed = tool(REASSIGN, null, 60, "--bootstrap-server", bs(), "--list").ok();
        check(listed.out().contains("No partition reassignments found"), "--list printed: %s", listed.summary());
        CliChecks.Run read = tool(CliChecks.CONSOLE_CONSUMER, null, 60, "--bootstrap-server", bs(), "--topic", t,
                "--from-beginning", "--max-messages", "20", "--timeout-ms", "30000").ok();
        for (int i = 0; i < 20; i++) {
            check(read.out().contains("moved-" + i + "\n"), "record moved-%d missing after the move: %s", i, read.summary());
        }

        java.nio.file.Path bad = java.nio.file.Files.createTempFile("reassign-bad", ".json");
        java.nio.file.Files.writeString(bad, "{\"version\":1,\"partitions\":[{\"topic\":\"" + t
                + "\",\"partition\":0,\"replicas\":[3," + (Main.brokers + 50) + "]}]}");
        CliChecks.Run refused = tool(REASSIGN, null, 60, "--bootstrap-server", bs(), "--execute",
                "--reassignment-json-file", bad.toString());
        check(refused.rc() != 0, "a target with an unknown broker was accepted: %s", refused.summary());
        check(replicasAndIsr(t)[1].equals("3,2"), "the refused plan changed the replicas");
        tool(CliChecks.TOPICS, null, 60, "--bootstrap-server", bs(), "--delete", "--topic", t).ok();
        return "--generate, --execute --throttle (throttled replicas and rates set), --verify (completed, throttles "
                + "removed), --list: the leader's replica moved from broker 1 to 3, 20 records read after; an unknown "
                + "broker refused";
    }

    /** One config's value as DescribeConfigs gives it ("" for a topic's throttled replicas left unset). */
    static String configValue(ConfigResource.Type type, String name, String key) throws Exception {
        ConfigResource resource = new ConfigResource(type, name);
        try (Admin admin = ClientChecks.admin()) {
            ConfigEntry e = admin.describeConfigs(List.of(resource)).all().get(30, TimeUnit.SECONDS).get(resource).get(key);
            return e == null ? "" : e.value();
        }
    }

    static String clusterId() throws Exception {
        CliChecks.Run r = tool(CLUSTER, null, 60, "cluster-id", "--bootstrap-server", bs()).ok();
        String printed = fields(r.out()).getOrDefault("Cluster ID", "");
        String expected;
        try (Admin admin = ClientChecks.admin()) {
            expected = admin.describeCluster().clusterId().get(30, TimeUnit.SECONDS);
        }
        check(!printed.isEmpty() && printed.equals(expected), "cluster-id printed %s, DescribeCluster says %s",
                r.out().strip(), expected);
        return "Cluster ID: " + printed;
    }

    static String features() throws Exception {
        CliChecks.Run r = tool(FEATURES, null, 60, "--bootstrap-server", bs(), "describe").ok();
        String line = r.lines().stream().filter(l -> l.contains("Feature: metadata.version")).findFirst().orElse("");
        check(line.contains("FinalizedVersionLevel: 4.1-IV1"), "kafka-features describe: %s", r.out().strip());
        return line.replace('\t', ' ');
    }
}
