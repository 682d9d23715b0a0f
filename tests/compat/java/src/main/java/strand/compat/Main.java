package strand.compat;

import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.Callable;

import org.apache.kafka.common.utils.AppInfoParser;

/**
 * Entry point of the Java compatibility programs.
 *
 * <pre>java -cp ... strand.compat.Main client|cli BOOTSTRAP</pre>
 *
 * Prints one RESULT line per capability and exits 1 if any is a fail. A
 * capability whose broker APIs are missing from ApiVersions and that fails is
 * reported as a gap naming those APIs; the same program passes once the broker
 * serves them.
 */
public final class Main {
    static String bootstrap;
    /** Brokers the cluster under test has (1 for a single node; 3 in the cluster modes). */
    static int brokers = 1;
    static final String VERSION = AppInfoParser.getVersion();
    static final String RUN_ID = Long.toString(System.currentTimeMillis(), 36)
            + Integer.toString((int) (Math.random() * 1296), 36);
    static int failures;
    static Map<Integer, short[]> advertised;

    /** A check saw something other than what Kafka would produce. */
    static final class Mismatch extends RuntimeException {
        Mismatch(String msg) { super(msg); }
    }

    static void check(boolean ok, String fmt, Object... args) {
        if (!ok) throw new Mismatch(String.format(fmt, args));
    }

    static final Map<Integer, String> API_NAMES = Map.ofEntries(
            Map.entry(22, "InitProducerId"),
            Map.entry(24, "AddPartitionsToTxn"),
            Map.entry(25, "AddOffsetsToTxn"),
            Map.entry(26, "EndTxn"),
            Map.entry(28, "TxnOffsetCommit"),
            Map.entry(65, "DescribeTransactions"),
            Map.entry(66, "ListTransactions"));

    public static void main(String[] args) throws Exception {
        List<String> modes = List.of("client", "cli", "cluster-client", "cluster-cli");
        if (args.length != 2 || !modes.contains(args[0])) {
            System.err.println("usage: Main client|cli|cluster-client|cluster-cli BOOTSTRAP");
            System.exit(2);
        }
        bootstrap = args[1];
        // The cluster modes: the same client checks against a three-broker
        // cluster (reported as java-cluster), and the cluster tools.
        String mode = args[0];
        if (mode.startsWith("cluster-")) {
            brokers = Integer.parseInt(System.getenv().getOrDefault("STRAND_BROKERS", "3"));
            ClientChecks.C = "java-cluster";
            mode = mode.substring("cluster-".length());
        }
        try {
            advertised = apiVersions(bootstrap);
        } catch (Exception e) {
            // No broker to talk to: report every capability as failed at once
            // instead of letting each one run into client timeouts.
            String why = "broker at " + bootstrap + " unreachable (ApiVersions probe: " + describe(e) + ")";
            String client = mode.equals("client") ? ClientChecks.C : brokers > 1 ? ClusterCliChecks.C : "kafka-cli";
            String[] caps = mode.equals("client")
                    ? new String[] {"admin", "produce", "consume-group", "committed-offsets", "idempotent", "transactions",
                        "consume-transform-produce"}
                    : brokers > 1 ? ClusterCliChecks.CAPABILITIES
                    : new String[] {"topics", "console-produce-consume", "consumer-groups", "transactions-cli"};
            for (String cap : caps) capability(client, cap, null, () -> { throw new Mismatch(why); });
            System.exit(1);
        }
        if (mode.equals("client")) {
            ClientChecks.runAll();
        } else if (brokers > 1) {
            ClusterCliChecks.runAll();
        } else {
            CliChecks.runAll();
        }
        System.out.flush();
        // Exit explicitly: stray client threads must not keep the JVM alive.
        System.exit(failures == 0 ? 0 : 1);
    }

    /**
     * Runs one capability: prints pass with the detail the body returns, or
     * fail/gap with the reason.
     */
    static void capability(String client, String name, int[] neededApis, Callable<String> body) {
        long start = System.nanoTime();
        String status;
        String detail;
        try {
            detail = body.call();
            status = "pass";
            String missing = missing(neededApis);
            if (!missing.isEmpty()) {
                // The client claims success although the broker cannot do the
                // thing: it silently fell back, which is not the capability.
                status = "gap";
                detail = missing + " not supported by the broker, yet the client reported success (" + detail + ")";
            }
        } catch (CliChecks.GapWithPass e) {
            status = "gap";
            detail = e.getMessage();
        } catch (Throwable e) {
            String reason = (e instanceof Mismatch) ? e.getMessage() : describe(e);
            String missing = missing(neededApis);
            if (!missing.isEmpty()) {
                status = "gap";
                detail = missing + " not supported by the broker (absent from ApiVersions); client: " + reason;
            } else {
                status = "fail";
                detail = reason;
                System.err.println("[" + client + " " + name + "] failure:");
                e.printStackTrace();
            }
        }
        if (status.equals("fail")) failures++;
        long ms = (System.nanoTime() - start) / 1_000_000;
        System.err.println("[" + client + " " + name + "] " + status + " in " + ms + " ms");
        System.out.println("RESULT client=" + client + " version=" + VERSION + " capability=" + name
                + " status=" + status + " detail=" + oneLine(detail));
        System.out.flush();
    }

    /** Names of the needed APIs the broker does not advertise, comma separated. */
    static String missing(int[] apis) {
        if (apis == null || advertised == null) return "";
        List<String> out = new ArrayList<>();
        for (int k : apis) {
            if (!advertised.containsKey(k)) out.add(API_NAMES.getOrDefault(k, "ApiKey " + k));
        }
        return String.join(", ", out);
    }

    static String describe(Throwable e) {
        StringBuilder sb = new StringBuilder();
        Throwable t = e;
        int depth = 0;
        while (t != null && depth < 4) {
            if (sb.length() > 0) sb.append(" <- ");
            sb.append(t.getClass().getSimpleName());
            if (t.getMessage() != null) sb.append(": ").append(t.getMessage());
            if (t.getCause() == t) break;
            t = t.getCause();
            depth++;
        }
        return sb.toString();
    }

    static String oneLine(String s) {
        if (s == null) return "";
        String r = s.replaceAll("[\\r\\n\\t]+", " ").trim();
        return r.length() > 400 ? r.substring(0, 400) + "..." : r;
    }

    /**
     * ApiVersions v0 over a raw socket: the broker's advertised API keys with
     * their (min, max) versions.
     */
    static Map<Integer, short[]> apiVersions(String bootstrap) throws Exception {
        int colon = bootstrap.lastIndexOf(':');
        String host = bootstrap.substring(0, colon);
        int port = Integer.parseInt(bootstrap.substring(colon + 1));
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress(host, port), 5000);
            s.setSoTimeout(5000);
            DataOutputStream out = new DataOutputStream(s.getOutputStream());
            DataInputStream in = new DataInputStream(s.getInputStream());
            byte[] clientId = "strand-compat-probe".getBytes(StandardCharsets.UTF_8);
            out.writeInt(2 + 2 + 4 + 2 + clientId.length);
            out.writeShort(18); // ApiVersions
            out.writeShort(0);
            out.writeInt(42);
            out.writeShort(clientId.length);
            out.write(clientId);
            out.flush();
            int size = in.readInt();
            int corr = in.readInt();
            if (corr != 42) throw new IllegalStateException("correlation id " + corr);
            short err = in.readShort();
            if (err != 0) throw new IllegalStateException("ApiVersions error " + err);
            int n = in.readInt();
            Map<Integer, short[]> m = new TreeMap<>();
            for (int i = 0; i < n; i++) {
                int key = in.readShort();
                short min = in.readShort();
                short max = in.readShort();
                m.put(key, new short[] {min, max});
            }
            return m;
        }
    }
}
