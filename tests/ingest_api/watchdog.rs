//! The harness's watchdog: a test that hangs ends its binary with its name and the
//! threads' stacks, instead of running into CI's overall timeout.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Not a test of its own: hangs on purpose, run by the test below in a child process.
#[tokio::test]
#[ignore = "hangs on purpose; a_hung_test_ends_its_binary_with_its_name_and_the_stacks runs it"]
async fn hangs_on_purpose() {
    chatpipe_tests::watchdog::arm();
    std::future::pending::<()>().await;
}

#[test]
fn a_hung_test_ends_its_binary_with_its_name_and_the_stacks() {
    let stderr = std::env::temp_dir().join(format!("chatpipe-watchdog-{}.txt", std::process::id()));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "watchdog::hangs_on_purpose"])
        .env("CHATPIPE_TEST_DEADLINE_SECS", "2")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the hanging test was still running 60 s after its 2 s deadline");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&stderr).unwrap();
    let _ = std::fs::remove_file(&stderr);
    assert_eq!(status.code(), Some(101), "{text}");
    assert!(
        text.contains("`watchdog::hangs_on_purpose` hung (still running after 2s"),
        "{text}"
    );
    let gdb = Command::new("gdb").arg("--version").output().is_ok();
    if gdb {
        // The hung test's own thread, parked in its runtime, is among the stacks.
        assert!(
            text.contains("Thread ") && text.contains("hangs_on_purpose::"),
            "{text}"
        );
    } else {
        assert!(text.contains("(no thread stacks: running gdb"), "{text}");
    }
}
