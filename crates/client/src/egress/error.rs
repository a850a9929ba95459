//! Why an egress selector configuration is refused: [`EgressError`] when loading or setting
//! it up, with the [`FieldError`]s of kube-apiserver's validation inside. A module of its own
//! so that the schema (`config`), the checks (`validate`) and `dialer` return these without
//! importing the selector above them.

use std::fmt;
use std::path::PathBuf;

/// Why a configuration could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("reading egress selector configuration {}: {error}", path.display())]
    Read {
        path: PathBuf,
        /// A plain field, not a `source()`: the message already holds its text.
        error: std::io::Error,
    },
    /// Not YAML/JSON, an unknown field, or another kind or version.
    #[error("decoding egress selector configuration: {0}")]
    Decode(String),
    /// Failed kube-apiserver's validation; the text is what kube-apiserver would print.
    #[error("invalid egress selector configuration: {}", aggregate(.0))]
    Invalid(Vec<FieldError>),
    /// Valid, but its transport cannot be set up (TLS files, URL, or an unsupported shape).
    #[error("egress selector transport: {0}")]
    Transport(String),
}

/// One problem: a field path, what is wrong, and the offending value where there is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub kind: FieldErrorKind,
    /// Rendered as Go renders it (a quoted string, or JSON for a struct).
    pub value: Option<String>,
    pub detail: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    Required,
    Invalid,
    NotSupported,
    Duplicate,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Invalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Duplicate => "Duplicate value",
        };
        write!(f, "{}: {kind}", self.field)?;
        if let Some(value) = &self.value {
            write!(f, ": {value}")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// Go's aggregate error text: one error as is, several (without repeats) in brackets.
pub fn aggregate(errors: &[FieldError]) -> String {
    let mut messages: Vec<String> = Vec::new();
    for message in errors.iter().map(ToString::to_string) {
        if !messages.contains(&message) {
            messages.push(message);
        }
    }
    match messages.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}
