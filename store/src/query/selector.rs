//! The query selector: `<profile type>{label="v", other=~"re.*"}`.
//!
//! The profile type is `name:sample_type:sample_unit:period_type:period_unit[:delta]`
//! and may be cut short after any part (`process_cpu`, `memory:alloc_space`)
//! as long as exactly one known profile type matches. Label names may contain
//! dots (`service.name`), as Pyroscope clients send them, and may be quoted
//! to hold any character (`{"k8s.pod.name"="x"}`, Prometheus 3's form, which
//! Grafana writes). Values are quoted
//! with `"`, `'` or backticks; `"` and `'` strings take `\"`, `\\`, `\n`, `\t`
//! escapes. Errors carry the 1-based character position of the mistake.

use kiln_engine::error::RegexRejection;
use kiln_engine::model::{MatchOp, Matcher, ProfileType, Selector};

/// Most label matchers in one selector. A query's matchers are kept, and
/// evaluated against every head and block it reads; a real query names a
/// handful of labels.
pub const MAX_MATCHERS: usize = 64;
/// Most `=~`/`!~` matchers in one selector. Each regex is compiled (once
/// here to check it, once more where the query runs, kept for its whole
/// visit), and each may take up to `REGEX_SIZE_LIMIT` for its program and
/// as much for its lazy DFA's cache, however short its text: counted by
/// their length alone, a 1 MiB body of short patterns held thousands of
/// them, gigabytes once compiled. At this cap one selector's regexes take
/// at most 16 MiB, and a request compiles one selector at a time.
pub const MAX_REGEX_MATCHERS: usize = 8;

/// A selector that cannot be parsed or resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The text does not follow the grammar.
    #[error("selector position {position}: expected {expected}, found {found}")]
    Syntax {
        /// 1-based character position of the mistake.
        position: usize,
        /// What the grammar allows there.
        expected: &'static str,
        /// What is there instead.
        found: String,
    },
    /// A `=~` or `!~` pattern is not a valid regular expression.
    #[error("selector position {position}: invalid regular expression: {message}")]
    BadRegex {
        /// 1-based character position of the pattern.
        position: usize,
        /// What the regex compiler said.
        message: String,
    },
    /// The selector holds more matchers, or more regex matchers, than
    /// one selector may.
    #[error("selector position {position}: more than {limit} {what} in one selector")]
    TooManyMatchers {
        /// 1-based character position of the first matcher past the cap.
        position: usize,
        /// `label matchers` or `regex matchers (=~, !~)`.
        what: &'static str,
        /// The cap.
        limit: usize,
    },
    /// The profile type part has more than six parts, or a sixth part other than `delta`.
    #[error("selector position {position}: {message}")]
    BadProfileType {
        /// 1-based character position of the offending part.
        position: usize,
        /// What is wrong.
        message: String,
    },
    /// No stored profile type matches the abbreviated one.
    #[error("no profile type matches {pattern:?}; known types: {known}")]
    UnknownProfileType {
        /// The profile type as written.
        pattern: String,
        /// The known types, comma separated (or "none").
        known: String,
    },
    /// More than one stored profile type matches the abbreviated one.
    #[error("profile type {pattern:?} is ambiguous; it matches: {candidates}")]
    AmbiguousProfileType {
        /// The profile type as written.
        pattern: String,
        /// The matching types, comma separated.
        candidates: String,
    },
}

impl SelectorError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Syntax { .. } => "selector_syntax",
            Self::BadRegex { .. } => "selector_bad_regex",
            Self::TooManyMatchers { .. } => "selector_too_many_matchers",
            Self::BadProfileType { .. } => "selector_bad_profile_type",
            Self::UnknownProfileType { .. } => "selector_unknown_profile_type",
            Self::AmbiguousProfileType { .. } => "selector_ambiguous_profile_type",
        }
    }
}

/// A parsed selector whose profile type may still be abbreviated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSelector {
    /// The profile type parts as written (1 to 6).
    pub profile_type_parts: Vec<String>,
    /// The label matchers.
    pub matchers: Vec<Matcher>,
}

impl ParsedSelector {
    /// The profile type as written.
    pub fn profile_type_text(&self) -> String {
        self.profile_type_parts.join(":")
    }

    /// True when `candidate` agrees with every part written.
    pub fn matches_profile_type(&self, candidate: &ProfileType) -> bool {
        let delta = if candidate.delta { "delta" } else { "" };
        let fields = [
            candidate.name.as_str(),
            &candidate.sample_type,
            &candidate.sample_unit,
            &candidate.period_type,
            &candidate.period_unit,
            delta,
        ];
        self.profile_type_parts
            .iter()
            .zip(fields)
            .all(|(part, field)| part == field)
    }

    /// Picks the single profile type in `known` that matches. A fully written
    /// five- or six-part type is taken as is, even if nothing is stored under it
    /// (the query then returns nothing rather than an error).
    pub fn resolve(&self, known: &[ProfileType]) -> Result<Selector, SelectorError> {
        if self.profile_type_parts.is_empty() {
            return Err(SelectorError::Syntax {
                position: 1,
                expected: "a profile type before `{`, e.g. process_cpu{...}",
                found: "'{'".to_owned(),
            });
        }
        let mut candidates: Vec<&ProfileType> = known
            .iter()
            .filter(|t| self.matches_profile_type(t))
            .collect();
        candidates.sort();
        candidates.dedup();
        if self.profile_type_parts.len() >= 5 {
            let full = self.full_profile_type();
            return Ok(Selector {
                profile_type: full,
                matchers: self.matchers.clone(),
            });
        }
        match candidates.as_slice() {
            [single] => Ok(Selector {
                profile_type: (*single).clone(),
                matchers: self.matchers.clone(),
            }),
            [] => Err(SelectorError::UnknownProfileType {
                pattern: self.profile_type_text(),
                known: join_types(known.iter()),
            }),
            many => Err(SelectorError::AmbiguousProfileType {
                pattern: self.profile_type_text(),
                candidates: join_types(many.iter().copied()),
            }),
        }
    }

    /// The selector with its profile type as written, the parts not
    /// written empty: for a type that could not be resolved because the
    /// types it was resolved against were not all the store holds (a
    /// peer did not answer). It selects what is stored under exactly that
    /// type, which is nothing the store could read, so the query answers
    /// empty, marked partial, where an error would claim the type unknown.
    pub fn unresolved(&self) -> Selector {
        Selector {
            profile_type: self.full_profile_type(),
            matchers: self.matchers.clone(),
        }
    }

    fn full_profile_type(&self) -> ProfileType {
        let part = |i: usize| self.profile_type_parts.get(i).cloned().unwrap_or_default();
        ProfileType {
            name: part(0),
            sample_type: part(1),
            sample_unit: part(2),
            period_type: part(3),
            period_unit: part(4),
            delta: self.profile_type_parts.len() == 6,
        }
    }
}

fn join_types<'a>(types: impl Iterator<Item = &'a ProfileType>) -> String {
    let names: Vec<String> = types.take(20).map(ToString::to_string).collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Parses `text` into a selector whose profile type may still be abbreviated.
pub fn parse_selector(text: &str) -> Result<ParsedSelector, SelectorError> {
    let mut cursor = Cursor::new(text);
    cursor.skip_spaces();
    let type_start = cursor.position();
    if cursor.peek() == Some('{') {
        // Matchers alone: fine for label and series listings, refused by
        // `resolve` for queries that need a profile type.
        cursor.bump();
        let matchers = parse_matchers(&mut cursor)?;
        cursor.skip_spaces();
        if cursor.peek().is_some() {
            return Err(cursor.expected("the end of the selector after `}`"));
        }
        return Ok(ParsedSelector {
            profile_type_parts: Vec::new(),
            matchers,
        });
    }
    let mut parts = vec![cursor.identifier("a profile type name, e.g. process_cpu")?];
    while cursor.peek() == Some(':') {
        cursor.bump();
        let part_position = cursor.position();
        // Parts after the name may be empty (`memory:inuse_space:bytes::`).
        let part = cursor.identifier_or_empty();
        if parts.len() == 6 {
            return Err(SelectorError::BadProfileType {
                position: part_position,
                message: "a profile type has at most six parts".to_owned(),
            });
        }
        if parts.len() == 5 && part != "delta" {
            return Err(SelectorError::BadProfileType {
                position: part_position,
                message: format!("the sixth profile type part must be `delta`, not {part:?}"),
            });
        }
        parts.push(part);
    }
    if parts[0].is_empty() {
        return Err(cursor.expected_at(type_start, "a profile type name"));
    }
    cursor.skip_spaces();
    let mut matchers = Vec::new();
    match cursor.peek() {
        None => {}
        Some('{') => {
            cursor.bump();
            matchers = parse_matchers(&mut cursor)?;
            cursor.skip_spaces();
            if cursor.peek().is_some() {
                return Err(cursor.expected("the end of the selector after `}`"));
            }
        }
        Some(_) => return Err(cursor.expected("`{` or the end of the selector")),
    }
    Ok(ParsedSelector {
        profile_type_parts: parts,
        matchers,
    })
}

fn parse_matchers(cursor: &mut Cursor<'_>) -> Result<Vec<Matcher>, SelectorError> {
    let mut matchers = Vec::new();
    let mut regexes = 0usize;
    loop {
        cursor.skip_spaces();
        if cursor.peek() == Some('}') {
            cursor.bump();
            return Ok(matchers);
        }
        if matchers.len() == MAX_MATCHERS {
            return Err(SelectorError::TooManyMatchers {
                position: cursor.position(),
                what: "label matchers",
                limit: MAX_MATCHERS,
            });
        }
        // A quoted name (Prometheus 3, Grafana's selectors) may hold any
        // character: `{"k8s.pod.name"="checkout-1"}`.
        let name = if matches!(cursor.peek(), Some('"' | '\'' | '`')) {
            let position = cursor.position();
            let name = cursor.quoted_string()?;
            if name.is_empty() {
                return Err(cursor.expected_at(position, "a label name, not an empty one"));
            }
            name
        } else {
            cursor.identifier("a label name or `}`")?
        };
        cursor.skip_spaces();
        let op = match (cursor.peek(), cursor.peek_second()) {
            (Some('='), Some('~')) => MatchOp::Regex,
            (Some('!'), Some('~')) => MatchOp::NotRegex,
            (Some('!'), Some('=')) => MatchOp::NotEqual,
            (Some('='), _) => MatchOp::Equal,
            _ => return Err(cursor.expected("`=`, `!=`, `=~` or `!~`")),
        };
        cursor.bump();
        if op != MatchOp::Equal {
            cursor.bump();
        }
        cursor.skip_spaces();
        let value_position = cursor.position();
        let value = cursor.quoted_string()?;
        if matches!(op, MatchOp::Regex | MatchOp::NotRegex) {
            regexes += 1;
            if regexes > MAX_REGEX_MATCHERS {
                return Err(SelectorError::TooManyMatchers {
                    position: value_position,
                    what: "regex matchers (=~, !~)",
                    limit: MAX_REGEX_MATCHERS,
                });
            }
            kiln_engine::index::compile_anchored_regex(&value).map_err(|rejection| {
                let message = match rejection {
                    RegexRejection::Invalid { source } => source
                        .to_string()
                        .lines()
                        .last()
                        .unwrap_or("")
                        .trim()
                        .to_owned(),
                    too_long @ RegexRejection::TooLong { .. } => too_long.to_string(),
                };
                SelectorError::BadRegex {
                    position: value_position,
                    message,
                }
            })?;
        }
        matchers.push(Matcher { name, op, value });
        cursor.skip_spaces();
        match cursor.peek() {
            Some(',') => cursor.bump(),
            Some('}') => {}
            _ => return Err(cursor.expected("`,` or `}`")),
        }
    }
}

/// A character cursor that knows its 1-based position.
struct Cursor<'a> {
    chars: Vec<char>,
    index: usize,
    _text: &'a str,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            chars: text.chars().collect(),
            index: 0,
            _text: text,
        }
    }

    fn position(&self) -> usize {
        self.index + 1
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.index).copied()
    }

    fn peek_second(&self) -> Option<char> {
        self.chars.get(self.index + 1).copied()
    }

    fn bump(&mut self) {
        self.index += 1;
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.index += 1;
        }
    }

    fn found(&self) -> String {
        match self.peek() {
            None => "the end of the selector".to_owned(),
            Some(c) => format!("{c:?}"),
        }
    }

    fn expected(&self, expected: &'static str) -> SelectorError {
        SelectorError::Syntax {
            position: self.position(),
            expected,
            found: self.found(),
        }
    }

    fn expected_at(&self, position: usize, expected: &'static str) -> SelectorError {
        SelectorError::Syntax {
            position,
            expected,
            found: self.chars.get(position - 1).map_or_else(
                || "the end of the selector".to_owned(),
                |c| format!("{c:?}"),
            ),
        }
    }

    /// `[A-Za-z_][A-Za-z0-9_.-]*`.
    fn identifier(&mut self, expected: &'static str) -> Result<String, SelectorError> {
        match self.peek() {
            Some(c) if c.is_ascii_alphabetic() || c == '_' => Ok(self.identifier_or_empty()),
            _ => Err(self.expected(expected)),
        }
    }

    fn identifier_or_empty(&mut self) -> String {
        let start = self.index;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        {
            self.index += 1;
        }
        self.chars[start..self.index].iter().collect()
    }

    fn quoted_string(&mut self) -> Result<String, SelectorError> {
        let quote = match self.peek() {
            Some(q @ ('"' | '\'' | '`')) => q,
            _ => return Err(self.expected("a quoted value, e.g. \"checkout\"")),
        };
        let open_position = self.position();
        self.bump();
        let mut value = String::new();
        loop {
            match self.peek() {
                None => {
                    return Err(SelectorError::Syntax {
                        position: open_position,
                        expected: "a closing quote for the value starting here",
                        found: "the end of the selector".to_owned(),
                    });
                }
                Some(c) if c == quote => {
                    self.bump();
                    return Ok(value);
                }
                Some('\\') if quote != '`' => {
                    self.bump();
                    let escaped = match self.peek() {
                        Some('n') => '\n',
                        Some('t') => '\t',
                        Some(c @ ('\\' | '"' | '\'')) => c,
                        _ => return Err(self.expected("an escape: \\\\, \\\", \\', \\n or \\t")),
                    };
                    value.push(escaped);
                    self.bump();
                }
                Some(c) => {
                    value.push(c);
                    self.bump();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
