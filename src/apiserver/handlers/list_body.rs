//! A list's JSON answer joined from parts it shares with the watch cache
//! (the list's head, then each item's JSON), put together as the client
//! reads it, in writes of about `WRITE_BYTES`. A list of 5,000 objects is
//! never copied into one buffer of its whole size: that buffer cost a
//! fresh mapping per list (a page fault every 4 KiB), and as many of them
//! as lists in flight. A list of a whole run of the cache's objects sends
//! writes it shares with the other lists of that run (`ListBody::shared`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::apiserver::watch_cache::list_writes::{ListWrites, WRITE_BYTES};

/// The items of a list, each a JSON value copied into the list's writes.
pub trait ListItems {
    /// How many there are.
    fn count(&self) -> usize;
    /// The length in bytes of the `i`-th.
    fn json_len(&self, i: usize) -> usize;
    /// Appends the JSON of the `i`-th to `out`.
    fn write_json(&self, i: usize, out: &mut Vec<u8>);
}

/// `{head…,"items":[item,item,…]}` where `head` is a JSON object (its
/// closing brace is left off) and each item a JSON value.
pub struct ListBody<L> {
    /// The head and `,"items":[`, until sent.
    head: Option<Bytes>,
    items: Items<L>,
    /// The next item (or shared write) to send; after the first, each
    /// item takes a comma.
    next: usize,
    /// Bytes not yet handed out; 0 once the closing `]}` is.
    remaining: u64,
}

/// Where a list's items come from.
enum Items<L> {
    /// Copied into writes of the list's own.
    Own(L),
    /// Writes shared with the other lists of the same objects, sent as
    /// they are after the head.
    Shared(Arc<ListWrites>),
}

const ITEMS: &[u8] = b",\"items\":[";
const END: &[u8] = b"]}";

/// `head` (an encoded JSON object) without its closing brace, then `,"items":[`.
fn opening(head: &[u8]) -> Bytes {
    Bytes::from([&head[..head.len().saturating_sub(1)], ITEMS].concat())
}

impl<L: ListItems> ListBody<L> {
    /// `head` is an encoded JSON object such as `{"kind":…,"metadata":{…}}`.
    pub fn new(head: &[u8], items: L) -> Self {
        let head = opening(head);
        let n = items.count();
        let len = head.len() + (0..n).map(|i| items.json_len(i)).sum::<usize>() + n.saturating_sub(1) + END.len();
        ListBody { head: Some(head), items: Items::Own(items), next: 0, remaining: len as u64 }
    }

    /// The same answer with the items from `writes`, shared with the other
    /// lists that send them.
    pub fn shared(head: &[u8], writes: Arc<ListWrites>) -> Self {
        let head = opening(head);
        let remaining = (head.len() + END.len()) as u64 + writes.byte_len();
        ListBody { head: Some(head), items: Items::Shared(writes), next: 0, remaining }
    }

    /// The next write: for items of its own, parts copied together up to
    /// about `WRITE_BYTES` (more when one part is larger); for shared
    /// ones, the head, each shared write, then the end.
    fn next_chunk(&mut self) -> Option<Bytes> {
        if self.remaining == 0 {
            return None;
        }
        let out = match &self.items {
            Items::Own(items) => {
                let mut out = Vec::with_capacity(WRITE_BYTES + (16 << 10));
                if let Some(head) = self.head.take() {
                    out.extend_from_slice(&head);
                }
                while out.len() < WRITE_BYTES {
                    if self.next == items.count() {
                        out.extend_from_slice(END);
                        break;
                    }
                    if self.next > 0 {
                        out.push(b',');
                    }
                    items.write_json(self.next, &mut out);
                    self.next += 1;
                }
                Bytes::from(out)
            }
            Items::Shared(writes) => match self.head.take() {
                Some(head) => head,
                None if self.next < writes.count() => {
                    self.next += 1;
                    writes.write(self.next - 1)
                }
                None => Bytes::from_static(END),
            },
        };
        self.remaining = self.remaining.saturating_sub(out.len() as u64);
        Some(out)
    }
}

impl<L: ListItems + Unpin> Body for ListBody<L> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().next_chunk().map(|c| Ok(Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    impl ListItems for Vec<Bytes> {
        fn count(&self) -> usize {
            self.len()
        }

        fn json_len(&self, i: usize) -> usize {
            self[i].len()
        }

        fn write_json(&self, i: usize, out: &mut Vec<u8>) {
            out.extend_from_slice(&self[i]);
        }
    }

    fn collect(mut body: ListBody<Vec<Bytes>>) -> (Vec<u8>, Vec<usize>) {
        let promised = body.size_hint().exact().expect("an exact length");
        let (mut all, mut sizes) = (Vec::new(), Vec::new());
        while let Some(c) = body.next_chunk() {
            assert_eq!(body.size_hint().exact(), Some(promised - all.len() as u64 - c.len() as u64));
            sizes.push(c.len());
            all.extend_from_slice(&c);
        }
        assert!(body.is_end_stream());
        assert_eq!(all.len() as u64, promised, "the length told up front is the length sent");
        (all, sizes)
    }

    fn head() -> Vec<u8> {
        serde_json::to_vec(&json!({"kind": "ConfigMapList", "metadata": {"resourceVersion": "7"}})).expect("head")
    }

    #[test]
    fn joins_the_head_and_items_into_the_list_json() {
        for n in [0usize, 1, 2, 3000] {
            let items: Vec<Bytes> =
                (0..n).map(|i| Bytes::from(json!({"metadata": {"name": format!("cm-{i}")}}).to_string())).collect();
            let (all, sizes) = collect(ListBody::new(&head(), items));
            let v: Value = serde_json::from_slice(&all).expect("the answer is JSON");
            assert_eq!(v["kind"], "ConfigMapList");
            assert_eq!(v["metadata"]["resourceVersion"], "7");
            let names: Vec<&str> =
                v["items"].as_array().expect("items").iter().filter_map(|i| i["metadata"]["name"].as_str()).collect();
            assert_eq!(names, (0..n).map(|i| format!("cm-{i}")).collect::<Vec<_>>());
            assert!(sizes.iter().all(|s| *s < WRITE_BYTES + 1024), "writes of about a chunk: {sizes:?}");
            if n == 3000 {
                assert!(sizes.len() > 1, "a large list is sent in several writes");
            }
        }
    }

    #[test]
    fn a_shared_list_body_is_the_same_json_as_a_list_of_its_own() {
        use crate::apiserver::watch_cache::object::{CachedObject, Form, Omit};
        use crate::apiserver::watch_cache::snapshot::Snapshot;
        let form = Form::new("v1", "ConfigMap", None);
        for n in [0usize, 1, 200] {
            let objs: Vec<_> = (0..n)
                .map(|i| {
                    let v = json!({"metadata": {"name": format!("cm-{i:04}")}, "data": {"k": "x".repeat(1000)}});
                    Arc::new(CachedObject::new(format!("/registry/configmaps/a/cm-{i:04}"), 1, v, &form))
                })
                .collect();
            let own: Vec<Bytes> = objs.iter().map(|o| o.json_for("v1", "ConfigMap", Omit::Nothing)).collect();
            let (want, _) = collect(ListBody::new(&head(), own));
            let snapshot = Arc::new(Snapshot::of(objs));
            let mut body: ListBody<Vec<Bytes>> = ListBody::shared(&head(), snapshot.list_writes(0..n, Omit::Nothing));
            let promised = body.size_hint().exact().expect("an exact length");
            let mut all = Vec::new();
            while let Some(c) = body.next_chunk() {
                all.extend_from_slice(&c);
                assert_eq!(body.size_hint().exact(), Some(promised - all.len() as u64));
            }
            assert!(body.is_end_stream());
            assert_eq!(String::from_utf8_lossy(&all), String::from_utf8_lossy(&want), "{n} objects");
        }
    }

    #[test]
    fn items_larger_than_a_chunk_are_sent_whole() {
        let big = || Bytes::from(json!({"data": "x".repeat(3 * WRITE_BYTES)}).to_string());
        let small = Bytes::from_static(b"{}");
        let (all, _) = collect(ListBody::new(&head(), vec![small.clone(), big(), big(), small]));
        let v: Value = serde_json::from_slice(&all).expect("JSON");
        let items = v["items"].as_array().expect("items");
        assert_eq!(items.len(), 4);
        assert_eq!(items[2]["data"].as_str().map(str::len), Some(3 * WRITE_BYTES));
    }
}
