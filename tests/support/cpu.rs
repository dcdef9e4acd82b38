//! Where the machine's CPU went during a benchmark phase: the CPU time each service's
//! processes used (from `/proc`, via `procfs`), in cores, so a figure can say which piece
//! it was bounded by. Linux only, like the stack.

use std::collections::BTreeMap;
use std::time::Instant;

/// The piece a process is counted under: PostgreSQL by its process title (the
/// walsender apart, it decodes the WAL for Debezium), the stack's JVMs by the
/// `chatpipe.stack.component` property scripts/stack gives them, ours by binary name (the
/// processors by their subcommand: fanout, receipts, archive, notifications, audit).
fn piece(argv: &[String]) -> Option<&'static str> {
    let first = argv.first()?;
    let binary = first.split(' ').next()?.rsplit('/').next()?;
    if binary.starts_with("postgres") {
        // The title is one argument or several, depending on how it was set.
        let walsender = argv.iter().any(|a| a.contains("walsender"));
        return Some(if walsender { "walsender" } else { "postgres" });
    }
    // The cluster's nodes and workers (kafka-2, connect-1) count with their kind.
    let component = argv
        .iter()
        .find_map(|a| a.strip_prefix("-Dchatpipe.stack.component="))
        .map(|c| c.trim_end_matches(|ch: char| ch.is_ascii_digit() || ch == '-'));
    match component {
        Some("connect") => return Some("kafka-connect"),
        Some("kafka") => return Some("kafka"),
        Some("registry") => return Some("registry"),
        Some("cassandra") => return Some("cassandra"),
        _ => {}
    }
    // The processors by their subcommand (`pipeline [--config F] fanout`).
    if binary == "pipeline" {
        let processor = ["fanout", "receipts", "archive", "notifications", "audit"]
            .into_iter()
            .find(|p| argv.iter().any(|a| a == p));
        return Some(processor.unwrap_or("pipeline"));
    }
    [
        "ingest-api",
        "gateway",
        "send-load",
        "read-storm",
        "cdc-latency",
        "push-latency",
        "pgbench",
        "wrk",
    ]
    .into_iter()
    .find(|b| *b == binary)
}

/// CPU ticks per piece at one moment.
pub struct CpuSample {
    at: Instant,
    ticks: BTreeMap<&'static str, u64>,
}

impl CpuSample {
    pub fn now() -> Self {
        let mut ticks = BTreeMap::new();
        if let Ok(all) = procfs::process::all_processes() {
            for process in all.flatten() {
                let (Ok(cmdline), Ok(stat)) = (process.cmdline(), process.stat()) else {
                    continue;
                };
                if let Some(name) = piece(&cmdline) {
                    *ticks.entry(name).or_default() += stat.utime + stat.stime;
                }
            }
        }
        Self {
            at: Instant::now(),
            ticks,
        }
    }

    /// Cores each piece used on average since `earlier` (processes that ended in
    /// between are not counted).
    pub fn cores_since(&self, earlier: &CpuSample) -> BTreeMap<&'static str, f64> {
        let seconds = self.at.duration_since(earlier.at).as_secs_f64();
        let per_second = procfs::ticks_per_second() as f64;
        self.ticks
            .iter()
            .map(|(name, &t)| {
                let before = earlier.ticks.get(name).copied().unwrap_or(0);
                (
                    *name,
                    t.saturating_sub(before) as f64 / per_second / seconds,
                )
            })
            .filter(|(_, cores)| *cores >= 0.005)
            .collect()
    }
}

/// `postgres 1.21, ingest-api 0.31, …`, the largest first.
pub fn describe(cores: &BTreeMap<&'static str, f64>) -> String {
    let mut v: Vec<_> = cores.iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    v.iter()
        .map(|(n, c)| format!("{n} {c:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::piece;

    fn argv(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn processes_are_counted_under_their_piece() {
        let cases = [
            (
                "postgres: 15/main: walsender postgres 127.0.0.1(49346) START",
                Some("walsender"),
            ),
            (
                "postgres: 15/main: postgres chatpipe 127.0.0.1(34680) idle",
                Some("postgres"),
            ),
            (
                "/usr/lib/postgresql/15/bin/postgres -D /var/lib/x",
                Some("postgres"),
            ),
            (
                "target/release/pipeline --config x.toml fanout",
                Some("fanout"),
            ),
            ("target/release/pipeline receipts", Some("receipts")),
            ("target/release/pipeline tail chat.events", Some("pipeline")),
            (
                "java -Dchatpipe.stack.component=connect -Xmx512m x",
                Some("kafka-connect"),
            ),
            (
                "java -Dchatpipe.stack.component=kafka -Xmx512m x",
                Some("kafka"),
            ),
            (
                "java -Dchatpipe.stack.component=registry x",
                Some("registry"),
            ),
            (
                "java -Dchatpipe.stack.component=kafka-2 -Xmx384m x",
                Some("kafka"),
            ),
            (
                "java -Dchatpipe.stack.component=connect-1 x",
                Some("kafka-connect"),
            ),
            ("java -Dchatpipe.stack.component=registry-auth x", None),
            (
                "java -Dchatpipe.stack.component=cassandra -Xmx1g x",
                Some("cassandra"),
            ),
            ("target/release/pipeline archive", Some("archive")),
            (
                "target/release/pipeline notifications",
                Some("notifications"),
            ),
            ("target/release/ingest-api", Some("ingest-api")),
            ("/work/main/target/release/pipeline fanout", Some("fanout")),
            ("bash -c pipeline", None),
        ];
        for (line, expected) in cases {
            assert_eq!(piece(&argv(line)), expected, "{line}");
        }
    }
}
