//! The TypeScript client (clients/typescript) against the real stack: its own tests
//! (Node's test runner, clients/typescript/test: the REST client and the gateway
//! connection, and the conversation store, whose tests end with each store equal to
//! history) run against an ingest-api, a fanout processor and a gateway started here,
//! as two users; and a second gateway, the binary, that a test kills with SIGKILL
//! mid-conversation and starts again (`CHATPIPE_GATEWAY_PROCESS`: its path, environment
//! and URL). `scripts/test` builds the package first (`npm ci`, `npm run build`).

use std::path::PathBuf;
use std::time::Duration;

use chatpipe_tests::binaries::{free_port, gateway_command};
use chatpipe_tests::stream::spawn_pipeline;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_client_passes_its_tests_on_the_stack() {
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/typescript");
    let tests = package.join("dist/test/stack.test.js");
    assert!(
        tests.exists(),
        "{} is missing: run the suite with scripts/test, which builds clients/typescript \
         (npm ci && npm run build)",
        tests.display()
    );
    let p = spawn_pipeline().await;
    let _fanout = p.start_fanout(p.fanout_settings());
    let gw = p.start_gateway(p.gateway_settings("sdk", 0)).await;
    let alice = 8_000_000 + i64::from(rand::random::<u32>() % 1_000_000);
    let bob = alice + 1_000_000;
    let users = serde_json::json!({
        "alice": {"id": alice, "token": p.app.token(alice)},
        "bob": {"id": bob, "token": p.app.token(bob), "expiredToken": p.app.expired_token(bob)},
    });
    // The gateway a test kills: another identity and deliveries partition.
    let addr = format!("127.0.0.1:{}", free_port());
    let mut killed = gateway_command(&p.gateway_settings("sdk-killed", 1), &addr);
    killed.env("RUST_LOG", "warn");
    let process = serde_json::json!({
        "bin": killed.get_program().to_string_lossy(),
        "env": killed
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_string_lossy(), v?.to_string_lossy())))
            .map(|(k, v)| (k.into_owned(), serde_json::Value::from(v.into_owned())))
            .collect::<serde_json::Map<_, _>>(),
        "url": format!("ws://{addr}/ws"),
    });
    let run = tokio::process::Command::new("npm")
        .args(["run", "--silent", "test"])
        .current_dir(&package)
        .env("CHATPIPE_API_URL", &p.app.base)
        .env("CHATPIPE_GATEWAY_URL", &gw.url)
        .env("CHATPIPE_USERS", users.to_string())
        .env("CHATPIPE_GATEWAY_PROCESS", process.to_string())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the package's tests finished within 180 s")
        .expect("npm runs (Node 20 or later)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the TypeScript client's tests failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Node's TAP summary: every test ran and passed (9 when this was written).
    let count = |label: &str| -> usize {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# {label} ")))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `# {label}` in the summary: {stdout}"))
    };
    assert!(
        count("tests") >= 9 && count("pass") == count("tests"),
        "{stdout}"
    );
    gw.stop().await.unwrap();
    p.cleanup().await;
}
