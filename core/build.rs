//! Stamps the binaries with the git revision they are built from (`chatpipe_build_info`).
//! A build without `.git` (a container build context) passes `CHATPIPE_REVISION` or
//! reports "unknown".

fn main() {
    println!("cargo:rerun-if-env-changed=CHATPIPE_REVISION");
    println!("cargo:rerun-if-changed=../.git/HEAD");
    println!("cargo:rerun-if-changed=../.git/refs/heads");
    let revision = std::env::var("CHATPIPE_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| {
            let out = std::process::Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=CHATPIPE_REVISION={revision}");
}
