package dev.chatpipe.examples;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.avro.AvroRuntimeException;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericEnumSymbol;
import org.apache.avro.generic.GenericFixed;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;

/**
 * Decodes chat.events values: the Confluent wire format by hand, the writer's schema from
 * the registry by the record's schema id, and Avro schema resolution from that writer
 * schema to the reader schema compiled into the job.
 *
 * <pre>
 *   byte 0      0x00 (magic byte)
 *   bytes 1..4  the writer's schema id in the registry, big-endian int
 *   bytes 5..   the Avro binary datum, written with that schema
 * </pre>
 *
 * Two kinds of failure, handled differently:
 * <ul>
 *   <li>{@link Undecodable}: the record's own fault, or a record this job cannot read
 *       (no Confluent frame, a schema id the registry does not know, a newer event type
 *       than the reader schema has). The caller reports it and goes on with the next.</li>
 *   <li>{@link RegistryUnavailable}: an outage. Nothing is wrong with the record, so it
 *       must not be skipped: the lookup is retried with a backoff, and only after
 *       {@link #REGISTRY_RETRY_FOR} does the job stop with this error.</li>
 * </ul>
 */
final class ChatEventDecoder {

    /** How long a registry outage is retried before the job gives up. */
    static final Duration REGISTRY_RETRY_FOR = Duration.ofSeconds(30);
    private static final Duration REQUEST_TIMEOUT = Duration.ofSeconds(10);
    private static final byte MAGIC_BYTE = 0x0;
    private static final int HEADER_SIZE = 5;

    private final String registryUrl;
    private final Schema readerSchema;
    private final HttpClient http =
            HttpClient.newBuilder().connectTimeout(REQUEST_TIMEOUT).build();
    private final ObjectMapper json = new ObjectMapper();
    /** One resolving reader per writer schema id: schemas under an id never change. */
    private final Map<Integer, GenericDatumReader<GenericRecord>> readers = new HashMap<>();
    private BinaryDecoder decoder; // reused between records

    ChatEventDecoder(String registryUrl, Schema readerSchema) {
        this.registryUrl = registryUrl.replaceAll("/+$", "");
        this.readerSchema = readerSchema;
    }

    /** A decoded value and the id of the schema it was written with. */
    record Decoded(int writerSchemaId, GenericRecord event) {}

    /** This record cannot be read by this job: report it and skip it. */
    static final class Undecodable extends Exception {
        final Integer writerSchemaId; // null when the record has no Confluent frame

        Undecodable(Integer writerSchemaId, String reason) {
            super(reason);
            this.writerSchemaId = writerSchemaId;
        }
    }

    /** The registry did not answer for {@link #REGISTRY_RETRY_FOR}: stop the job. */
    static final class RegistryUnavailable extends RuntimeException {
        RegistryUnavailable(String message) {
            super(message);
        }
    }

    Decoded decode(byte[] value) throws Undecodable {
        // 1. The Confluent frame.
        if (value == null) {
            throw new Undecodable(null, "null value (no Confluent frame)");
        }
        if (value.length < HEADER_SIZE) {
            throw new Undecodable(null, "not the Confluent wire format: only " + value.length + " bytes");
        }
        if (value[0] != MAGIC_BYTE) {
            throw new Undecodable(null,
                    String.format("not the Confluent wire format: magic byte 0x%02x", value[0] & 0xff));
        }
        int schemaId = ByteBuffer.wrap(value, 1, 4).getInt();

        // 2. The writer's schema, and a reader that resolves it to our compiled schema.
        GenericDatumReader<GenericRecord> reader = readers.get(schemaId);
        if (reader == null) {
            reader = new GenericDatumReader<>(writerSchema(schemaId), readerSchema);
            readers.put(schemaId, reader);
        }

        // 3. The Avro datum. A record of an event type our schema does not have (a newer
        // branch of the payload union) fails here with an AvroTypeException, e.g.
        // "Found chatpipe.events.MessageEdited, expecting union": that is the record to skip.
        GenericRecord event;
        try {
            decoder = DecoderFactory.get().binaryDecoder(value, HEADER_SIZE, value.length - HEADER_SIZE, decoder);
            event = reader.read(null, decoder);
        } catch (IOException | AvroRuntimeException e) { // AvroTypeException is an AvroRuntimeException
            throw new Undecodable(schemaId, e.getClass().getSimpleName() + ": " + e.getMessage());
        } catch (RuntimeException e) { // corrupt bytes: negative lengths, bad union index, ...
            throw new Undecodable(schemaId, "corrupt Avro datum: " + e);
        }

        // 4. `type` names the payload branch (message.new -> MessageNew). Avro may resolve
        // an unknown writer branch to a *different* reader branch whose fields happen to
        // fit; such a record is not the event this job thinks it is, so skip it too.
        Object payload = event.get("payload");
        Object type = event.get("type");
        if (payload instanceof GenericRecord p && type != null
                && !p.getSchema().getName().equals(branchName(type.toString()))) {
            throw new Undecodable(schemaId, "event type " + type + " is not in the reader schema"
                    + " (its payload resolved to " + p.getSchema().getName() + ")");
        }
        return new Decoded(schemaId, event);
    }

    /** "member.role_changed" -> "MemberRoleChanged": the payload record's name for a type. */
    static String branchName(String type) {
        StringBuilder name = new StringBuilder();
        for (String part : type.split("[._]")) {
            if (!part.isEmpty()) {
                name.append(Character.toUpperCase(part.charAt(0))).append(part.substring(1));
            }
        }
        return name.toString();
    }

    /**
     * GET {registry}/schemas/ids/{id}, answered as {"schema": "<the schema as a JSON string>"}.
     * 404 is the record's fault (an id this registry never issued). Connection failures,
     * timeouts, 429 and 5xx are outages: retried with a backoff for up to 30 s.
     */
    private Schema writerSchema(int id) throws Undecodable {
        URI uri = URI.create(registryUrl + "/schemas/ids/" + id);
        HttpRequest request = HttpRequest.newBuilder(uri)
                .timeout(REQUEST_TIMEOUT)
                .header("Accept", "application/vnd.schemaregistry.v1+json, application/json")
                .GET()
                .build();
        long deadline = System.nanoTime() + REGISTRY_RETRY_FOR.toNanos();
        long backoffMs = 200;
        while (true) {
            String problem;
            try {
                HttpResponse<String> response = http.send(request, HttpResponse.BodyHandlers.ofString());
                int status = response.statusCode();
                if (status == 200) {
                    return parseSchema(id, response.body());
                }
                if (status == 404) {
                    throw new Undecodable(id, "schema id " + id + " not found in the registry");
                }
                if (status != 429 && status < 500) { // 401, 403, 400...: retrying will not help
                    throw new RegistryUnavailable("schema registry answered HTTP " + status + " for "
                            + uri + ": " + abbreviate(response.body()));
                }
                problem = "HTTP " + status;
            } catch (IOException e) { // refused, reset, timed out
                problem = e.getClass().getSimpleName() + (e.getMessage() == null ? "" : ": " + e.getMessage());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new RegistryUnavailable("interrupted while fetching " + uri);
            }
            if (System.nanoTime() + backoffMs * 1_000_000 > deadline) {
                throw new RegistryUnavailable("schema registry unreachable for "
                        + REGISTRY_RETRY_FOR.toSeconds() + " s (" + uri + "): " + problem);
            }
            System.err.printf("registry: %s for schema id %d, retrying in %d ms%n", problem, id, backoffMs);
            try {
                Thread.sleep(backoffMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new RegistryUnavailable("interrupted while fetching " + uri);
            }
            backoffMs = Math.min(backoffMs * 2, 5_000);
        }
    }

    private Schema parseSchema(int id, String body) throws Undecodable {
        try {
            JsonNode schema = json.readTree(body).get("schema");
            if (schema == null || !schema.isTextual()) {
                throw new Undecodable(id, "registry answer for schema id " + id + " has no \"schema\"");
            }
            // A new Parser per schema: one Parser refuses to define the same names twice.
            return new Schema.Parser().parse(schema.asText());
        } catch (IOException | RuntimeException e) {
            throw new Undecodable(id, "schema id " + id + " is not a usable Avro schema: " + e.getMessage());
        }
    }

    private static String abbreviate(String s) {
        return s.length() <= 200 ? s : s.substring(0, 200) + "...";
    }

    /**
     * An Avro datum as plain Java values that Jackson writes as JSON: records become maps
     * in field order (a union's value is just its branch's record), strings (including
     * uuid) become Strings, longs (including timestamp-micros) stay numbers.
     * GenericData's toString is not used: it is not JSON for every value.
     */
    static Object toJsonValue(Object datum) {
        if (datum == null) {
            return null;
        }
        if (datum instanceof GenericRecord record) {
            Map<String, Object> fields = new LinkedHashMap<>();
            for (Schema.Field field : record.getSchema().getFields()) {
                fields.put(field.name(), toJsonValue(record.get(field.pos())));
            }
            return fields;
        }
        if (datum instanceof CharSequence || datum instanceof GenericEnumSymbol<?>) {
            return datum.toString(); // Avro's Utf8 -> String
        }
        if (datum instanceof ByteBuffer bytes) {
            return Base64.getEncoder().encodeToString(toArray(bytes));
        }
        if (datum instanceof GenericFixed fixed) {
            return Base64.getEncoder().encodeToString(fixed.bytes());
        }
        if (datum instanceof Map<?, ?> map) {
            Map<String, Object> out = new LinkedHashMap<>();
            map.forEach((k, v) -> out.put(k.toString(), toJsonValue(v)));
            return out;
        }
        if (datum instanceof Collection<?> items) {
            List<Object> out = new ArrayList<>(items.size());
            items.forEach(item -> out.add(toJsonValue(item)));
            return out;
        }
        return datum; // Long, Integer, Double, Float, Boolean
    }

    private static byte[] toArray(ByteBuffer buffer) {
        byte[] bytes = new byte[buffer.remaining()];
        buffer.duplicate().get(bytes);
        return bytes;
    }
}
