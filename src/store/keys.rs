//! etcd's key-range convention: an empty `range_end` means one key, `"\0"`
//! means every key from `key` on, anything else is the half-open `[key, end)`.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRange {
    /// Exactly one key.
    Single(Vec<u8>),
    /// `[start, end)`; `end == None` is unbounded.
    Span { start: Vec<u8>, end: Option<Vec<u8>> },
}

impl KeyRange {
    pub fn new(key: &[u8], range_end: &[u8]) -> Self {
        match range_end {
            [] => KeyRange::Single(key.to_vec()),
            [0] => KeyRange::Span { start: key.to_vec(), end: None },
            end => KeyRange::Span { start: key.to_vec(), end: Some(end.to_vec()) },
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeyRange::Single(k) => k.as_slice() == key,
            KeyRange::Span { start, end } => key >= start.as_slice() && end.as_ref().is_none_or(|e| key < e.as_slice()),
        }
    }

    /// True when the range can hold no key at all (`end <= start`).
    pub fn is_empty(&self) -> bool {
        matches!(self, KeyRange::Span { start, end: Some(end) } if end <= start)
    }

    /// True when two ranges share at least one key.
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        match (self, other) {
            (KeyRange::Single(a), b) | (b, KeyRange::Single(a)) => b.contains(a),
            (KeyRange::Span { start: s1, end: e1 }, KeyRange::Span { start: s2, end: e2 }) => {
                let below = |start: &Vec<u8>, end: &Option<Vec<u8>>| end.as_ref().is_none_or(|e| start < e);
                below(s2, e1) && below(s1, e2)
            }
        }
    }
}

/// The `range_end` that selects every key starting with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_etcd_convention() {
        let one = KeyRange::new(b"a", b"");
        assert!(one.contains(b"a") && !one.contains(b"ab"));
        let open = KeyRange::new(b"b", b"\0");
        assert!(open.contains(b"zzz") && !open.contains(b"a"));
        let span = KeyRange::new(b"a", &prefix_end(b"a"));
        assert!(span.contains(b"a/x") && !span.contains(b"b"));
        assert!(KeyRange::new(b"b", b"a").is_empty());
        assert!(span.overlaps(&one) && !span.overlaps(&open));
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
