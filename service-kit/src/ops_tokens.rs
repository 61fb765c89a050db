//! Named operator tokens, one per person or script, read from `OPS_TOKENS_FILE`: the audit log
//! then says who acted, where `ADMIN_TOKEN` records every action as `admin`.
//!
//! One token per line, `<name> <role> <token>`, the role `admin` (acts and reads) or `read`
//! (reads only); blank lines and lines starting with `#` are skipped:
//!
//! ```text
//! # name   role   token
//! ada      admin  7f3c9e…
//! grafana  read   c41d08…
//! ```

use std::collections::HashSet;

use secrecy::{ExposeSecret as _, SecretString};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read, and act: retry, skip, replay.
    Admin,
    /// Read only.
    Read,
}

/// One named token.
#[derive(Debug, Clone)]
pub struct NamedToken {
    /// Who holds it, as the audit log records it.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The token.
    pub token: SecretString,
}

/// The tokens of `OPS_TOKENS_FILE`.
#[derive(Debug, Clone, Default)]
pub struct OpsTokens(pub Vec<NamedToken>);

/// The shortest token the file takes: a guessable one would hand out the actions.
pub const MIN_TOKEN_LEN: usize = 16;

impl OpsTokens {
    /// Reads and parses the file at `path`; the error says which line is wrong and why, never
    /// quoting a token.
    pub fn read(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|error| format!("{path}: {error}"))?;
        Self::parse(&text)
    }

    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut tokens = Vec::new();
        let (mut names, mut secrets) = (HashSet::new(), HashSet::new());
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = |reason: &str| format!("line {}: {reason}", number + 1);
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, role, token] = fields[..] else {
                return Err(at("write `<name> <admin|read> <token>`"));
            };
            if !is_valid_name(name) {
                return Err(at(
                    "a name is 1-64 ASCII letters, digits, '.', '_', '@' or '-'",
                ));
            }
            if [crate::admin::ADMIN, crate::admin::READ_ONLY].contains(&name) {
                return Err(at(&format!(
                    "{name:?} names ADMIN_TOKEN or READ_TOKEN in the audit log; choose another"
                )));
            }
            let role = match role {
                "admin" => Role::Admin,
                "read" => Role::Read,
                _ => return Err(at("the role is `admin` or `read`")),
            };
            // No value of the line is quoted from here on: with its columns swapped, the name
            // would be the token.
            if token.len() < MIN_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(at(&format!(
                    "a token is {MIN_TOKEN_LEN} or more visible ASCII characters"
                )));
            }
            if !names.insert(name.to_owned()) {
                return Err(at("this name is on an earlier line"));
            }
            if !secrets.insert(token.to_owned()) {
                return Err(at(
                    "this token is an earlier line's: the audit log could not tell them apart",
                ));
            }
            tokens.push(NamedToken {
                name: name.to_owned(),
                role,
                token: SecretString::from(token),
            });
        }
        Ok(Self(tokens))
    }

    /// Whether one of the tokens is `secret`.
    pub fn holds(&self, secret: &str) -> bool {
        self.0.iter().any(|t| t.token.expose_secret() == secret)
    }

    /// Whether any token may act.
    pub fn has_admin(&self) -> bool {
        self.0.iter().any(|t| t.role == Role::Admin)
    }
}

fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADA: &str = "ada-0123456789abcdef";
    const BOT: &str = "bot-0123456789abcdef";

    #[test]
    fn a_file_names_each_token_and_its_role() {
        let text = format!("# who role token\n\nada admin {ADA}\n  grafana   read {BOT}  \n");
        let tokens = OpsTokens::parse(&text).unwrap();
        let read: Vec<_> = tokens.0.iter().map(|t| (t.name.as_str(), t.role)).collect();
        assert_eq!(read, [("ada", Role::Admin), ("grafana", Role::Read)]);
        assert!(tokens.holds(BOT) && !tokens.holds("bot"));
        assert!(tokens.has_admin());
    }

    #[test]
    fn a_bad_line_is_named_and_no_token_is_quoted() {
        for (text, expected) in [
            ("ada admin\n".to_owned(), "line 1: write"),
            (format!("ada owner {ADA}"), "line 1: the role is"),
            (format!("a da admin {ADA}"), "line 1: write"),
            (format!("ad/a admin {ADA}"), "line 1: a name is"),
            (
                format!("admin admin {ADA}"),
                "line 1: \"admin\" names ADMIN_TOKEN",
            ),
            (
                "ada admin tiny1".to_owned(),
                "line 1: a token is 16 or more",
            ),
            (format!("ada admin {ADA}é"), "line 1: a token is 16 or more"),
            (
                format!("ada admin {ADA}\nada read {BOT}"),
                "line 2: this name is on",
            ),
            (
                format!("ada admin {ADA}\nbot read {ADA}"),
                "line 2: this token is an earlier",
            ),
            // Columns swapped: the token would be the name, and is not quoted.
            (format!("{ADA} admin ada"), "line 1: a token is 16 or more"),
        ] {
            let error = OpsTokens::parse(&text).unwrap_err();
            assert!(error.starts_with(expected), "{text:?}: {error}");
            assert!(!error.contains(ADA) && !error.contains("tiny1"), "{error}");
        }
    }

    #[test]
    fn a_missing_file_is_named() {
        let error = OpsTokens::read("/nonexistent/ops-tokens").unwrap_err();
        assert!(error.starts_with("/nonexistent/ops-tokens: "), "{error}");
    }
}
