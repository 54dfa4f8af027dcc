//! The label selector syntax of list and watch requests, read as upstream's
//! lexer and recursive-descent parser read it, with its error messages:
//!
//! ```text
//! selector    := requirement ("," requirement)*
//! requirement := ["!"] KEY [("in" | "notin") "(" VALUE ("," VALUE)* ")" | ("=" | "==" | "!=" | ">" | "<") VALUE]
//! ```
//!
//! Keys must be qualified names and values label values; `>` and `<` take an
//! integer. Whitespace separates tokens; `in` and `notin` are values where a
//! value is expected (`x in (in)`).

use std::collections::BTreeSet;

use crate::apiserver::status::{summary, Cause};
use crate::apiserver::validation::{label_value, qualified_name, quote};

/// What is wrong with a label selector, in upstream's words.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SelectorError {
    /// A token the grammar does not allow here, and what it expects.
    #[error("found '{found}', expected: {expected}")]
    Unexpected { found: String, expected: &'static str },
    /// No `(` after `in` or `notin` (upstream words this one without a comma).
    #[error("found '{0}' expected: '('")]
    NoOpenParenthesis(String),
    /// A requirement that does not parse.
    #[error("unable to parse requirement: {0}")]
    Requirement(#[source] Box<SelectorError>),
    /// A key or values that are not valid, as field errors.
    #[error("{}", summary(.0))]
    Invalid(Vec<Cause>),
}

fn unexpected(found: &str, expected: &'static str) -> SelectorError {
    SelectorError::Unexpected { found: found.to_string(), expected }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    End,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

/// The operators, as a requirement carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    In,
    NotIn,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    Exists,
    DoesNotExist,
}

/// One parsed requirement: key, operator and values (sorted, deduplicated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRequirement {
    pub key: String,
    pub op: Operator,
    pub values: Vec<String>,
}

fn keyword(s: &str) -> Option<Token> {
    Some(match s {
        ")" => Token::ClosedPar,
        "," => Token::Comma,
        "!" => Token::DoesNotExist,
        "==" => Token::DoubleEquals,
        "=" => Token::Equals,
        ">" => Token::GreaterThan,
        "in" => Token::In,
        "<" => Token::LessThan,
        "!=" => Token::NotEquals,
        "notin" => Token::NotIn,
        "(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_special(c: u8) -> bool {
    matches!(c, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// Splits `s` into tokens: runs of special symbols take the longest
/// operator they start with; anything else up to a symbol or a space is an
/// identifier (or the keyword `in`/`notin`).
fn lex(s: &str) -> Vec<(Token, &str)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut pos = 0;
    loop {
        while pos < b.len() && is_space(b[pos]) {
            pos += 1;
        }
        if pos >= b.len() {
            out.push((Token::End, ""));
            return out;
        }
        let start = pos;
        if is_special(b[pos]) {
            // Every single symbol is an operator; extend while it stays one.
            let mut end = pos + 1;
            while end < b.len() && is_special(b[end]) && keyword(&s[start..=end]).is_some() {
                end += 1;
            }
            let lit = &s[start..end];
            out.push((keyword(lit).unwrap_or(Token::Identifier), lit));
            pos = end;
        } else {
            while pos < b.len() && !is_special(b[pos]) && !is_space(b[pos]) {
                pos += 1;
            }
            let lit = &s[start..pos];
            let tok = match keyword(lit) {
                Some(t @ (Token::In | Token::NotIn)) => t,
                _ => Token::Identifier,
            };
            out.push((tok, lit));
        }
    }
}

struct Parser<'a> {
    items: Vec<(Token, &'a str)>,
    pos: usize,
}

impl<'a> Parser<'a> {
    /// The current token; where a value is expected, `in` and `notin` are identifiers.
    fn lookahead(&self, values: bool) -> (Token, &'a str) {
        let (t, lit) = self.items.get(self.pos).copied().unwrap_or((Token::End, ""));
        match t {
            Token::In | Token::NotIn if values => (Token::Identifier, lit),
            _ => (t, lit),
        }
    }

    fn consume(&mut self, values: bool) -> (Token, &'a str) {
        let item = self.lookahead(values);
        self.pos += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<ParsedRequirement>, SelectorError> {
        let mut out = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(true);
            match tok {
                Token::Identifier | Token::DoesNotExist => {
                    out.push(self.requirement().map_err(|e| SelectorError::Requirement(Box::new(e)))?);
                    let (t, l) = self.consume(true);
                    match t {
                        Token::End => return Ok(out),
                        Token::Comma => {
                            let (t2, l2) = self.lookahead(true);
                            if t2 != Token::Identifier && t2 != Token::DoesNotExist {
                                return Err(unexpected(l2, "identifier after ','"));
                            }
                        }
                        _ => return Err(unexpected(l, "',' or 'end of string'")),
                    }
                }
                Token::End => return Ok(out),
                _ => return Err(unexpected(lit, "!, identifier, or 'end of string'")),
            }
        }
    }

    fn requirement(&mut self) -> Result<ParsedRequirement, SelectorError> {
        let (mut tok, mut key) = self.consume(true);
        let negated = tok == Token::DoesNotExist;
        if negated {
            (tok, key) = self.consume(true);
        }
        if tok != Token::Identifier {
            return Err(unexpected(key, "identifier"));
        }
        let problems = qualified_name(key);
        if !problems.is_empty() {
            let message = format!("Invalid value: {}: {}", quote(key), problems.join("; "));
            return Err(SelectorError::Invalid(vec![Cause::invalid("<nil>", message)]));
        }
        let (next, _) = self.lookahead(true);
        if negated || next == Token::End || next == Token::Comma {
            let op = if negated { Operator::DoesNotExist } else { Operator::Exists };
            return Ok(ParsedRequirement { key: key.to_string(), op, values: Vec::new() });
        }
        let (tok, lit) = self.consume(false);
        let op = match tok {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => return Err(unexpected(lit, "in, notin, =, ==, !=, gt, lt")),
        };
        let values = match op {
            Operator::In | Operator::NotIn => self.set_values()?,
            _ => self.exact_value()?,
        };
        let values: Vec<String> = values.into_iter().collect();
        check_values(key, op, &values)?;
        Ok(ParsedRequirement { key: key.to_string(), op, values })
    }

    /// `( v1, v2, … )`; `()` is the one empty value.
    fn set_values(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        let (tok, lit) = self.consume(true);
        if tok != Token::OpenPar {
            return Err(SelectorError::NoOpenParenthesis(lit.to_string()));
        }
        let (tok, lit) = self.lookahead(true);
        match tok {
            Token::Identifier | Token::Comma => {
                let set = self.identifiers()?;
                if self.consume(true).0 != Token::ClosedPar {
                    return Err(unexpected(lit, "')'"));
                }
                Ok(set)
            }
            Token::ClosedPar => {
                self.consume(true);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(unexpected(lit, "',', ')' or identifier")),
        }
    }

    /// A comma-separated list of (possibly empty) values, up to the `)`.
    fn identifiers(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        let mut set = BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(true);
            match tok {
                Token::Identifier => {
                    set.insert(lit.to_string());
                    let (t2, l2) = self.lookahead(true);
                    match t2 {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(set),
                        _ => return Err(unexpected(l2, "',' or ')'")),
                    }
                }
                Token::Comma => {
                    if set.is_empty() {
                        set.insert(String::new());
                    }
                    match self.lookahead(true).0 {
                        Token::ClosedPar => {
                            set.insert(String::new());
                            return Ok(set);
                        }
                        Token::Comma => {
                            self.consume(true);
                            set.insert(String::new());
                        }
                        _ => {}
                    }
                }
                _ => return Err(unexpected(lit, "',', or identifier")),
            }
        }
    }

    /// The one value after `=`, `==`, `!=`, `>` or `<` (empty at a `,` or the end).
    fn exact_value(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        let (tok, _) = self.lookahead(true);
        if tok == Token::End || tok == Token::Comma {
            return Ok(BTreeSet::from([String::new()]));
        }
        match self.consume(true) {
            (Token::Identifier, lit) => Ok(BTreeSet::from([lit.to_string()])),
            (_, lit) => Err(unexpected(lit, "identifier")),
        }
    }
}

/// Upstream's NewRequirement checks of the values; several problems are
/// listed in brackets, as an aggregate error prints them.
fn check_values(key: &str, op: Operator, values: &[String]) -> Result<(), SelectorError> {
    let mut errs: Vec<Cause> = Vec::new();
    if matches!(op, Operator::GreaterThan | Operator::LessThan) {
        for (i, v) in values.iter().enumerate() {
            if v.parse::<i64>().is_err() {
                errs.push(Cause::invalid(
                    format!("values[{i}]"),
                    format!("Invalid value: {}: for 'Gt', 'Lt' operators, the value must be an integer", quote(v)),
                ));
            }
        }
    }
    for (i, v) in values.iter().enumerate() {
        let problems = label_value(v);
        if !problems.is_empty() {
            errs.push(Cause::invalid(
                format!("values[{i}][{key}]"),
                format!("Invalid value: {}: {}", quote(v), problems.join("; ")),
            ));
        }
    }
    errs.dedup_by(|a, b| a.field == b.field && a.message == b.message);
    match errs.is_empty() {
        true => Ok(()),
        false => Err(SelectorError::Invalid(errs)),
    }
}

/// Parses a label selector string, or says what is wrong with it in
/// upstream's words.
pub fn parse(selector: &str) -> Result<Vec<ParsedRequirement>, SelectorError> {
    let mut requirements = Parser { items: lex(selector), pos: 0 }.parse()?;
    requirements.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(requirements)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(s: &str) -> Vec<(String, Operator, Vec<String>)> {
        parse(s).unwrap().into_iter().map(|r| (r.key, r.op, r.values)).collect()
    }

    #[test]
    fn reads_every_form() {
        assert!(parse("").unwrap().is_empty() && parse("  ").unwrap().is_empty());
        assert_eq!(ops("a=b"), vec![("a".into(), Operator::Equals, vec!["b".into()])]);
        assert_eq!(ops("a==b")[0].1, Operator::DoubleEquals);
        assert_eq!(ops("a != b")[0].1, Operator::NotEquals);
        assert_eq!(ops("!a")[0].1, Operator::DoesNotExist);
        assert_eq!(ops("a")[0].1, Operator::Exists);
        assert_eq!(ops("a=")[0].2, vec![String::new()]);
        assert_eq!(ops("x in (foo,,baz)")[0].2, vec!["".to_string(), "baz".into(), "foo".into()]);
        assert_eq!(ops("x notin ()")[0].2, vec![String::new()]);
        assert_eq!(ops("x in (in, notin)")[0].2, vec!["in".to_string(), "notin".into()]);
        assert_eq!(ops("n>3")[0], ("n".into(), Operator::GreaterThan, vec!["3".into()]));
        // Sorted by key, as upstream sorts requirements.
        let keys: Vec<String> = ops("z, a=1, m in (x)").into_iter().map(|r| r.0).collect();
        assert_eq!(keys, ["a", "m", "z"]);
    }

    #[test]
    fn errors_in_upstreams_words() {
        let e = |s: &str| parse(s).unwrap_err().to_string();
        assert_eq!(e("a in (b"), "unable to parse requirement: found '', expected: ',' or ')'");
        assert_eq!(e("a in b"), "unable to parse requirement: found 'b' expected: '('");
        assert_eq!(e("a=b=c"), "found '=', expected: ',' or 'end of string'");
        assert_eq!(e("a=b,"), "found '', expected: identifier after ','");
        assert_eq!(e(",a"), "found ',', expected: !, identifier, or 'end of string'");
        assert_eq!(e("a b"), "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt");
        assert_eq!(e("n>x"), "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer");
        assert!(e("a$b=c").starts_with(
            "unable to parse requirement: <nil>: Invalid value: \"a$b\": name part must consist of alphanumeric characters"
        ));
        assert!(e("app=-x").starts_with(
            "unable to parse requirement: values[0][app]: Invalid value: \"-x\": a valid label must be an empty string"
        ));
        assert!(e("a in (-x, -y)").starts_with("unable to parse requirement: [values[0][a]: Invalid value: \"-x\""));
    }
}
