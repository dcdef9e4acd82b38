//! The stack's pinned versions, read from `scripts/stack.env`, the one place they are
//! written: the native stack sources it, the containers of [`crate::stack`] take their
//! tags from here, and a contract test checks the compose files' images against it.

/// The value `scripts/stack.env` pins `name` to (`NAME=${NAME:-value}`).
pub fn pinned(name: &str) -> &'static str {
    const STACK_ENV: &str = include_str!("../../scripts/stack.env");
    STACK_ENV
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix("=${")?;
            let (_, default) = rest.split_once(":-")?;
            Some(default.split_once('}')?.0)
        })
        .unwrap_or_else(|| panic!("scripts/stack.env pins no {name}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pinned_version_is_the_default_of_its_line() {
        assert_eq!(super::pinned("PG_MAJOR"), "17");
        assert!(super::pinned("KAFKA_VERSION").starts_with("4."));
    }
}
