//! The dependency tree: one TLS and crypto library for every client of ours (sqlx's
//! PostgreSQL TLS, reqwest's HTTPS to the registry and JWKS, jsonwebtoken's signatures):
//! aws-lc-rs. A second one (ring) would be a second thing to patch and to audit, and a
//! rustls without a process-wide default provider panics when both are linked.

use crate::repo_root;

#[test]
fn the_built_tree_links_one_crypto_provider() {
    // Cargo.lock lists optional dependencies too (ring stays there as an option of rustls
    // and sqlx): what is built is what `cargo tree` resolves with the features in use.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree = crate::run_tool(
        &cargo,
        &[
            "tree",
            "--workspace",
            "--locked",
            "--edges",
            "normal,build",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ],
        &repo_root(),
        "cargo runs the tests",
    );
    let packages: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        packages.contains(&"aws-lc-rs"),
        "aws-lc-rs is not built:\n{tree}"
    );
    assert!(
        !packages.contains(&"ring"),
        "ring is built beside aws-lc-rs: `cargo tree -i ring` says who brings it"
    );
}
