#!/usr/bin/env python3
"""A Spark Structured Streaming job on chatpipe's analytics topics (docs/topics.md,
"Analytics topics"): messages per conversation per hour, and read latency.

    pip install -r docs/examples/spark/requirements.txt      # PySpark; Java 17
    python3 docs/examples/spark/analytics_job.py --lake /tmp/chatpipe-lake

It reads `chat.analytics.messages` and `chat.analytics.reads` with Spark's Kafka source
(spark-sql-kafka) and decodes them with spark-avro's `from_avro`, using the schema the
registry holds for each topic (the value past Confluent's 5-byte frame; every version of
these schemas reads every other: FULL_TRANSITIVE). Each micro-batch is applied to a
small lake of two tables, as a lakehouse job would:

- `messages`: the newest version of each message, by `changedAt` -- the MERGE of
  docs/topics.md, so a deleted message's row has no body, and a late replay of an older
  version never brings it back;
- `reads`: each read watermark move once (dedupe by conversationId, userId, toSeq).

Run with `--trigger available-now` (the default) it reads what is on the topics and
stops, then prints two results as JSON lines:

- `{"result": "messages_per_hour", "conversationId", "hour", "messages"}`: messages sent
  per conversation per hour (`hour`: the hour's start, microseconds since the epoch);
- `{"result": "read_latency", "conversationId", "reads", "p50", "p99"}`: for each message
  and each member who has read it (not its sender), the time in seconds from the message
  to the first read move that covers it (`toSeq >= seq`); exact percentiles per
  conversation (Spark's `percentile`, linear between ranks).

`--trigger every-10s`: micro-batches every 10 s until stopped (the results are then
printed by a run with --report-only). `--print-messages` also prints the `messages`
table, a row per message: `{"result": "message", "conversationId", "seq", "body",
"deleted"}`.
"""
import argparse
import json
import os
import sys
import urllib.request

SPARK = "3.5.7"
PACKAGES = [
    f"org.apache.spark:spark-sql-kafka-0-10_2.12:{SPARK}",
    f"org.apache.spark:spark-avro_2.12:{SPARK}",
]


def registry_schema(registry: str, subject: str) -> str:
    """The newest schema of `subject`, as the registry serves it (Confluent API)."""
    with urllib.request.urlopen(f"{registry}/subjects/{subject}/versions/latest", timeout=30) as r:
        return json.load(r)["schema"]


def session(app: str):
    from pyspark.sql import SparkSession
    return (SparkSession.builder.appName(app)
            .master(os.environ.get("SPARK_MASTER", "local[2]"))
            .config("spark.jars.packages", ",".join(PACKAGES))
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.ui.enabled", "false")
            .getOrCreate())


def stream(spark, brokers: str, topic: str, schema: str):
    """The topic's records as rows of its schema's fields."""
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.functions import col, expr
    raw = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", brokers)
           .option("subscribe", topic)
           .option("startingOffsets", "earliest")
           .option("failOnDataLoss", "false")  # the messages topic is compacted
           .load())
    framed = raw.where(col("value").isNotNull()).select(
        expr("substring(value, 6, length(value) - 5)").alias("avro"))
    return framed.select(from_avro(col("avro"), schema).alias("r")).select("r.*")


def merge_into(lake: str, table: str, keep):
    """foreachBatch: the batch and what `table` holds, reduced by `keep`, written back."""
    def apply(batch, _batch_id):
        path = os.path.join(lake, table)
        rows = batch
        if os.path.exists(path):
            rows = batch.sparkSession.read.parquet(path).unionByName(batch)
        # Materialized before the table it was read from is overwritten.
        keep(rows).localCheckpoint().write.mode("overwrite").parquet(path)
    return apply


def newest_version(rows):
    """`messages`: the newest version of each message (the MERGE of docs/topics.md)."""
    from pyspark.sql import Window
    from pyspark.sql.functions import col, row_number
    newest = Window.partitionBy("conversationId", "seq").orderBy(col("changedAt").desc())
    return rows.withColumn("n", row_number().over(newest)).where("n = 1").drop("n")


def each_move_once(rows):
    """`reads`: each watermark move once."""
    return rows.dropDuplicates(["conversationId", "userId", "toSeq"])


def report(spark, lake: str, print_messages: bool, out):
    spark.read.parquet(os.path.join(lake, "messages")).createOrReplaceTempView("messages")
    spark.read.parquet(os.path.join(lake, "reads")).createOrReplaceTempView("reads")
    per_hour = spark.sql("""
        SELECT conversationId, unix_micros(window(createdAt, '1 hour').start) AS hour,
               count(*) AS messages
          FROM messages
         GROUP BY conversationId, window(createdAt, '1 hour')
         ORDER BY conversationId, hour""")
    latency = spark.sql("""
        WITH first_read AS (
            SELECT m.conversationId, m.seq, r.userId,
                   (unix_micros(min(r.at)) - unix_micros(m.createdAt)) / 1e6 AS seconds
              FROM messages m
              JOIN reads r ON r.conversationId = m.conversationId AND r.toSeq >= m.seq
                          AND r.userId <> m.senderId
             GROUP BY m.conversationId, m.seq, r.userId, m.createdAt)
        SELECT conversationId, count(*) AS reads,
               percentile(seconds, 0.5) AS p50, percentile(seconds, 0.99) AS p99
          FROM first_read
         GROUP BY conversationId
         ORDER BY conversationId""")
    for row in per_hour.collect():
        print(json.dumps({"result": "messages_per_hour", **row.asDict()}), file=out, flush=True)
    for row in latency.collect():
        print(json.dumps({"result": "read_latency", **row.asDict()}), file=out, flush=True)
    if print_messages:
        for row in spark.sql("""SELECT conversationId, seq, body, deletedAt IS NOT NULL AS deleted
                                  FROM messages ORDER BY conversationId, seq""").collect():
            print(json.dumps({"result": "message", **row.asDict()}), file=out, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", default=os.environ.get("KAFKA_BROKERS", "127.0.0.1:9092"))
    ap.add_argument("--registry", default=os.environ.get(
        "SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7"))
    ap.add_argument("--messages-topic", default="chat.analytics.messages")
    ap.add_argument("--reads-topic", default="chat.analytics.reads")
    ap.add_argument("--lake", required=True, help="where the tables and checkpoints live")
    ap.add_argument("--trigger", choices=["available-now", "every-10s"], default="available-now")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--print-messages", action="store_true",
                    help="also print the messages table: each message as its newest version left it")
    args = ap.parse_args()

    # The results alone on standard output: the JVM (Ivy resolving the packages, Spark's
    # own messages) writes to the process's stdout, which goes to stderr from here on.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    spark = session("chatpipe-analytics")
    spark.sparkContext.setLogLevel("WARN")
    if not args.report_only:
        queries = []
        for topic, keep, name in [(args.messages_topic, newest_version, "messages"),
                                  (args.reads_topic, each_move_once, "reads")]:
            rows = stream(spark, args.brokers, topic, registry_schema(args.registry, f"{topic}-value"))
            writer = (rows.writeStream.foreachBatch(merge_into(args.lake, name, keep))
                      .option("checkpointLocation", os.path.join(args.lake, "_checkpoints", name)))
            writer = (writer.trigger(availableNow=True) if args.trigger == "available-now"
                      else writer.trigger(processingTime="10 seconds"))
            queries.append(writer.start())
        for q in queries:
            q.awaitTermination()
    report(spark, args.lake, args.print_messages, out)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
