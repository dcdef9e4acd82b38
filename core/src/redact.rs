//! Secrets kept out of what is logged or shown: passwords inside URLs and librdkafka
//! properties that hold credentials. Every URL or property set a service prints goes
//! through here.

/// What stands in for a secret.
pub const MASK: &str = "***";

/// `url` with the password of its user info masked (`postgres://u:***@host/db`).
/// Anything that is not a URL with a password comes back as it is.
pub fn url(url: &str) -> String {
    match password_of(url) {
        Some(password) => url.replacen(&format!(":{password}@"), &format!(":{MASK}@"), 1),
        None => url.to_owned(),
    }
}

/// `text` (an error message, say) with the password of `url` masked wherever it appears.
pub fn text(text: &str, url: &str) -> String {
    match password_of(url) {
        Some(password) if !password.is_empty() => text.replace(password, MASK),
        _ => text.to_owned(),
    }
}

/// The password in `scheme://user:password@host…`, as written (percent-encoded).
fn password_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let userinfo = authority.rsplit_once('@')?.0;
    Some(userinfo.split_once(':')?.1)
}

/// Whether a librdkafka property holds a credential (`sasl.password`,
/// `ssl.key.password`, `ssl.key.pem`, `sasl.oauthbearer.client.secret`, a JAAS line).
pub fn is_secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "jaas", "key.pem", "credentials"]
        .iter()
        .any(|word| key.contains(word))
}

/// A property set as it may be printed: credentials masked.
pub fn properties<'a>(
    properties: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> std::collections::BTreeMap<&'a str, &'a str> {
    properties
        .into_iter()
        .map(|(k, v)| {
            let shown = if is_secret_property(k) {
                MASK
            } else {
                v.as_str()
            };
            (k.as_str(), shown)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_urls_password_is_masked_and_the_rest_kept() {
        assert_eq!(
            url("postgres://svc:p%40ss@db.example:5432/chat?sslmode=verify-full"),
            "postgres://svc:***@db.example:5432/chat?sslmode=verify-full"
        );
        assert_eq!(url("https://reg.example/apis"), "https://reg.example/apis");
        assert_eq!(
            url("https://user@reg.example/apis"),
            "https://user@reg.example/apis"
        );
        assert_eq!(url("not a url"), "not a url");
    }

    #[test]
    fn a_password_quoted_in_an_error_is_masked() {
        let said = text(
            "error connecting to https://u:s3cret@reg/x: s3cret refused",
            "https://u:s3cret@reg/x",
        );
        assert_eq!(said, "error connecting to https://u:***@reg/x: *** refused");
    }

    #[test]
    fn credential_properties_are_masked_and_others_shown() {
        let props: std::collections::BTreeMap<String, String> = [
            ("sasl.password", "pw"),
            ("sasl.username", "svc"),
            ("ssl.key.password", "kp"),
            ("sasl.oauthbearer.client.secret", "cs"),
            ("security.protocol", "SASL_SSL"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let shown = properties(&props);
        assert_eq!(shown["sasl.password"], MASK);
        assert_eq!(shown["ssl.key.password"], MASK);
        assert_eq!(shown["sasl.oauthbearer.client.secret"], MASK);
        assert_eq!(shown["sasl.username"], "svc");
        assert_eq!(shown["security.protocol"], "SASL_SSL");
    }
}
