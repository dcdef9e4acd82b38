package dev.chatpipe.examples;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import org.apache.avro.Schema;
import org.apache.avro.SchemaParseException;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * Reads chatpipe's chat.events the way a JVM job with a compiled Avro schema does.
 *
 * <pre>
 *   mvn -B -q package -DskipTests
 *   java -jar target/chat-events-consumer.jar [--from-beginning] [--max N] [--idle-timeout S]
 *        [--reader-schema PATH] [--brokers HOST:PORT] [--registry URL] [--topic NAME]
 * </pre>
 *
 * Each value is decoded with the writer's schema (fetched from the registry by the id in
 * the record) resolved to the reader schema: by default the schemas/chat_event.avsc this
 * jar was built with, or any older version given with --reader-schema.
 *
 * The rule for chat.events (docs/topics.md): new event types arrive as new branches of the
 * `payload` union, so a job built on an older schema meets records it cannot resolve.
 * It skips them, one by one, and keeps going; it never stops on one.
 *
 * stdout: one JSON line per record, either
 *   {"key": "42", "partition": 3, "offset": 17, "event": {"type": ..., "payload": {...}}}
 *   {"skipped": {"partition": 3, "offset": 18, "writerSchemaId": 5, "reason": "..."}}
 * stderr: diagnostics and errors.
 */
public final class ConsumeChatEvents {

    private static final String FIXED_GROUP_ID = "chatpipe-jvm-example";
    private static final String BUNDLED_SCHEMA = "/schemas/chat_event.avsc";
    private static final Duration POLL_TIMEOUT = Duration.ofMillis(500);

    private static final ObjectMapper JSON = new ObjectMapper();
    private static volatile boolean interrupted;
    // stdout carries the JSON lines only, in UTF-8, flushed line by line.
    private static final PrintStream OUT =
            new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);

    public static void main(String[] argv) {
        Args args;
        Schema readerSchema;
        try {
            args = Args.parse(argv);
            readerSchema = loadReaderSchema(args.readerSchema);
        } catch (IllegalArgumentException | IOException | SchemaParseException e) {
            System.err.println("error: " + e.getMessage());
            System.err.println(Args.USAGE);
            System.exit(2);
            return;
        }
        int exitCode = run(args, readerSchema);
        if (!interrupted) { // on Ctrl-C the JVM is already exiting (and exit() would block)
            System.exit(exitCode);
        }
    }

    static int run(Args args, Schema readerSchema) {
        ChatEventDecoder decoder = new ChatEventDecoder(args.registry, readerSchema);

        // --from-beginning: a fresh group that starts at the earliest offset, so every run
        // reads the whole topic. Otherwise: a fixed group that resumes where it stopped
        // (and starts at the end the first time).
        String groupId = args.fromBeginning ? FIXED_GROUP_ID + "-" + UUID.randomUUID() : FIXED_GROUP_ID;
        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args.brokers);
        config.put(ConsumerConfig.GROUP_ID_CONFIG, groupId);
        config.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, args.fromBeginning ? "earliest" : "latest");
        config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false"); // committed below, after printing
        config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());

        System.err.printf("reading %s from %s as group %s (reader schema: %s, registry: %s)%n",
                args.topic, args.brokers, groupId,
                args.readerSchema == null ? "bundled " + BUNDLED_SCHEMA.substring(1) : args.readerSchema,
                args.registry);

        KafkaConsumer<String, byte[]> consumer = new KafkaConsumer<>(config);
        // Ctrl-C: wake the consumer out of poll(), let main commit and close, then exit.
        Thread mainThread = Thread.currentThread();
        Thread hook = new Thread(() -> {
            interrupted = true;
            consumer.wakeup();
            try {
                mainThread.join(10_000);
            } catch (InterruptedException ignored) {
                // exiting anyway
            }
        });
        Runtime.getRuntime().addShutdownHook(hook);

        // The next offset to commit per partition: a record's offset + 1 once its line is out.
        Map<TopicPartition, OffsetAndMetadata> done = new HashMap<>();
        long handled = 0;
        long lastRecordAt = System.nanoTime();
        int exitCode = 0;
        try {
            consumer.subscribe(List.of(args.topic));
            outer:
            while (true) {
                ConsumerRecords<String, byte[]> records = consumer.poll(POLL_TIMEOUT);
                if (records.isEmpty()) {
                    if (args.idleTimeoutSeconds > 0
                            && System.nanoTime() - lastRecordAt >= (long) (args.idleTimeoutSeconds * 1e9)) {
                        System.err.printf("no record for %s s, stopping%n", args.idleTimeoutSeconds);
                        break;
                    }
                    continue;
                }
                for (ConsumerRecord<String, byte[]> record : records) {
                    printLine(handle(decoder, record));
                    done.put(new TopicPartition(record.topic(), record.partition()),
                            new OffsetAndMetadata(record.offset() + 1));
                    handled++;
                    if (args.max > 0 && handled >= args.max) {
                        break outer;
                    }
                }
                consumer.commitSync(done);
                done.clear();
                lastRecordAt = System.nanoTime(); // idle counts from the last record handled
            }
        } catch (WakeupException e) {
            System.err.println("interrupted, stopping");
        } catch (ChatEventDecoder.RegistryUnavailable e) {
            // An outage, not a bad record: do not skip it. Stop here; the group's committed
            // offsets point at this record, so the next run starts with it.
            System.err.println("error: " + e.getMessage());
            exitCode = 1;
        } finally {
            try {
                if (!done.isEmpty()) {
                    consumer.commitSync(done);
                }
            } catch (RuntimeException e) {
                System.err.println("warning: could not commit offsets: " + e.getMessage());
            }
            consumer.close(CloseOptions.timeout(Duration.ofSeconds(5)));
        }
        try {
            Runtime.getRuntime().removeShutdownHook(hook);
        } catch (IllegalStateException shuttingDown) {
            // Ctrl-C: the hook is running and waits for us
        }
        return exitCode;
    }

    /** One record to one output line: the decoded event, or why it was skipped. */
    private static Map<String, Object> handle(ChatEventDecoder decoder, ConsumerRecord<String, byte[]> record) {
        Map<String, Object> line = new LinkedHashMap<>();
        try {
            ChatEventDecoder.Decoded decoded = decoder.decode(record.value());
            line.put("key", record.key());
            line.put("partition", record.partition());
            line.put("offset", record.offset());
            line.put("event", ChatEventDecoder.toJsonValue(decoded.event()));
        } catch (ChatEventDecoder.Undecodable e) {
            // The rule: a record this job cannot read (a newer event type, or not a
            // Confluent-framed Avro record at all) is reported and skipped. The job goes on.
            Map<String, Object> skipped = new LinkedHashMap<>();
            skipped.put("partition", record.partition());
            skipped.put("offset", record.offset());
            skipped.put("writerSchemaId", e.writerSchemaId);
            skipped.put("reason", e.getMessage());
            line.put("skipped", skipped);
        }
        return line;
    }

    private static void printLine(Map<String, Object> line) {
        try {
            OUT.println(JSON.writeValueAsString(line));
        } catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot write JSON", e); // plain maps: does not happen
        }
        OUT.flush();
    }

    /** The schema "compiled into the job": a file, or the copy bundled in this jar. */
    private static Schema loadReaderSchema(String path) throws IOException {
        if (path != null) {
            String text;
            try {
                text = Files.readString(Path.of(path));
            } catch (IOException e) {
                throw new IOException("cannot read --reader-schema " + path + ": " + e, e);
            }
            return new Schema.Parser().parse(text);
        }
        try (InputStream in = ConsumeChatEvents.class.getResourceAsStream(BUNDLED_SCHEMA)) {
            if (in == null) {
                throw new IOException(BUNDLED_SCHEMA + " is not in the jar: build it with mvn package");
            }
            return new Schema.Parser().parse(in);
        }
    }

    /** Command-line options, with the same names and defaults as consume_chat_events.py. */
    static final class Args {
        static final String USAGE = String.join("\n",
                "usage: java -jar chat-events-consumer.jar [options]",
                "  --brokers HOST:PORT    Kafka bootstrap servers (env KAFKA_BROKERS, default 127.0.0.1:9092)",
                "  --registry URL         Confluent-API schema registry (env SCHEMA_REGISTRY_URL,",
                "                         default http://127.0.0.1:8081/apis/ccompat/v7)",
                "  --topic NAME           default chat.events",
                "  --from-beginning       a fresh consumer group from the earliest offset",
                "                         (default: group " + FIXED_GROUP_ID + ", from the latest)",
                "  --max N                stop after N records, decoded or skipped (0: never; default 0)",
                "  --idle-timeout S       stop after S seconds without a record (0: never; default 0)",
                "  --reader-schema PATH   the Avro schema your job was built with",
                "                         (default: schemas/chat_event.avsc, bundled at build time)");

        String brokers = envOr("KAFKA_BROKERS", "127.0.0.1:9092");
        String registry = envOr("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7");
        String topic = "chat.events";
        boolean fromBeginning;
        long max;
        double idleTimeoutSeconds;
        String readerSchema;

        static Args parse(String[] argv) {
            Args a = new Args();
            for (int i = 0; i < argv.length; i++) {
                String arg = argv[i];
                String value = null;
                int eq = arg.indexOf('=');
                if (arg.startsWith("--") && eq > 0) { // --max=20
                    value = arg.substring(eq + 1);
                    arg = arg.substring(0, eq);
                }
                switch (arg) {
                    case "-h", "--help" -> {
                        System.out.println(USAGE);
                        System.exit(0);
                    }
                    case "--from-beginning" -> a.fromBeginning = true;
                    case "--brokers" -> a.brokers = value != null ? value : next(argv, ++i, arg);
                    case "--registry" -> a.registry = value != null ? value : next(argv, ++i, arg);
                    case "--topic" -> a.topic = value != null ? value : next(argv, ++i, arg);
                    case "--reader-schema" -> a.readerSchema = value != null ? value : next(argv, ++i, arg);
                    case "--max" -> a.max = number(value != null ? value : next(argv, ++i, arg), arg).longValue();
                    case "--idle-timeout" ->
                            a.idleTimeoutSeconds = number(value != null ? value : next(argv, ++i, arg), arg);
                    default -> throw new IllegalArgumentException("unknown argument " + argv[i]);
                }
            }
            return a;
        }

        private static String next(String[] argv, int i, String flag) {
            if (i >= argv.length) {
                throw new IllegalArgumentException(flag + " needs a value");
            }
            return argv[i];
        }

        private static Double number(String s, String flag) {
            try {
                double d = Double.parseDouble(s);
                if (d < 0 || Double.isNaN(d)) {
                    throw new NumberFormatException();
                }
                return d;
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException(flag + " needs a number >= 0, not " + s);
            }
        }

        private static String envOr(String name, String fallback) {
            String v = System.getenv(name);
            return v == null || v.isBlank() ? fallback : v;
        }
    }
}
