//! A txn as the writer applies it: its compares read at the current
//! revision, then each operation of the branch taken (put, delete range,
//! range, nested txn) under the one revision the txn writes.

use super::Writer;
use crate::store::proto::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::store::proto::{request_op::Request, response_op::Response, *};
use crate::store::sqlite::read::{self, event_of, Latest, Row};
use crate::store::sqlite::schema::{self, row_id, MAX_SUB};
use crate::store::{KeyRange, Result, StoreError};

impl Writer {
    pub(super) fn apply_txn_request(&mut self, req: TxnRequest, events: &mut Vec<Event>) -> Result<TxnResponse> {
        let rev = self.meta.rev + 1;
        let mut sub = 0;
        let mut resp = self.apply_txn(req, rev, &mut sub, events)?;
        if sub > 0 {
            self.meta.rev = rev;
        }
        resp.header = Some(self.shared.header(self.meta.rev));
        Ok(resp)
    }

    fn apply_txn(&mut self, req: TxnRequest, rev: i64, sub: &mut i64, events: &mut Vec<Event>) -> Result<TxnResponse> {
        let TxnRequest { compare, success, failure } = req;
        let mut succeeded = true;
        // What `current` holds for the key of a single-key compare: the put
        // of that key that opens the branch (the apiserver's create and
        // update) need not read it again.
        let mut compared: Option<(usize, Latest)> = None;
        for (i, c) in compare.iter().enumerate() {
            let (ok, row) = self.compare(c)?;
            if let Some(row) = row {
                compared = Some((i, row));
            }
            if !ok {
                succeeded = false;
                break;
            }
        }
        let ops = if succeeded { success } else { failure };
        let mut responses = Vec::with_capacity(ops.len());
        for (n, op) in ops.into_iter().enumerate() {
            let response = match op.request {
                Some(Request::RequestRange(r)) => {
                    let head = if *sub > 0 { rev } else { self.meta.rev };
                    let mut resp = read::range(&self.conn, &r, head, self.meta.compact_rev)?;
                    resp.header = Some(ResponseHeader { revision: head, ..Default::default() });
                    Response::ResponseRange(resp)
                }
                Some(Request::RequestPut(p)) => {
                    let known = match compared.take() {
                        Some((i, row)) if n == 0 && compare[i].key == p.key => Some(row),
                        _ => None,
                    };
                    Response::ResponsePut(self.put(p, known, rev, sub, events)?)
                }
                Some(Request::RequestDeleteRange(d)) => {
                    Response::ResponseDeleteRange(self.delete_range(&d, rev, sub, events)?)
                }
                Some(Request::RequestTxn(t)) => {
                    let mut inner = self.apply_txn(t, rev, sub, events)?;
                    let head = if *sub > 0 { rev } else { self.meta.rev };
                    inner.header = Some(ResponseHeader { revision: head, ..Default::default() });
                    Response::ResponseTxn(inner)
                }
                None => continue,
            };
            responses.push(ResponseOp { response: Some(response) });
        }
        Ok(TxnResponse { header: None, succeeded, responses })
    }

    /// Whether the compare holds, and for a single key its entry in `current`.
    fn compare(&self, c: &Compare) -> Result<(bool, Option<Latest>)> {
        let target = CompareTarget::try_from(c.target).unwrap_or(CompareTarget::Version);
        let absent = |c: &Compare| {
            target != CompareTarget::Value
                && compare_row(
                    c,
                    target,
                    &Row { id: 0, key: Vec::new(), create_rev: 0, version: 0, lease: 0, value: Vec::new() },
                )
        };
        let range = KeyRange::new(&c.key, &c.range_end);
        if let KeyRange::Single(key) = &range {
            let latest = read::get_latest(&self.conn, key)?;
            let ok = match &latest.live {
                Some(row) => compare_row(c, target, row),
                None => absent(c),
            };
            return Ok((ok, Some(latest)));
        }
        let rows = read::current_in_range(&self.conn, &range, None, target != CompareTarget::Value)?;
        let ok = if rows.is_empty() { absent(c) } else { rows.iter().all(|row| compare_row(c, target, row)) };
        Ok((ok, None))
    }

    fn next_id(rev: i64, sub: &mut i64) -> Result<i64> {
        if *sub > MAX_SUB {
            return Err(StoreError::InvalidArgument("too many changes in one revision".into()));
        }
        let id = row_id(rev, *sub);
        *sub += 1;
        Ok(id)
    }

    /// `known`: the key's entry in `current` when the txn's compare has
    /// just read it.
    fn put(
        &mut self,
        p: PutRequest,
        known: Option<Latest>,
        rev: i64,
        sub: &mut i64,
        events: &mut Vec<Event>,
    ) -> Result<PutResponse> {
        let Latest { live: prev, id: latest_id } = match known {
            Some(latest) => latest,
            None => read::get_latest(&self.conn, &p.key)?,
        };
        if (p.ignore_value || p.ignore_lease) && prev.is_none() {
            return Err(StoreError::KeyNotFound);
        }
        let lease = match (&prev, p.ignore_lease) {
            (Some(prev), true) => prev.lease,
            _ => p.lease,
        };
        if lease != 0 && !self.lease_exists(lease)? {
            return Err(StoreError::LeaseNotFound);
        }
        let value = match (&prev, p.ignore_value) {
            (Some(prev), true) => prev.value.clone(),
            _ => p.value,
        };
        let (create_rev, version) = prev.as_ref().map_or((rev, 1), |r| (r.create_rev, r.version + 1));
        let id = Self::next_id(rev, sub)?;
        // A key created again links to its tombstone, so that a read at a
        // revision before the delete still finds the older row.
        let prev_id = latest_id;
        self.conn
            .prepare_cached(
                "INSERT INTO log (id, key, create_rev, version, lease, value, prev_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute((id, &p.key, create_rev, version, lease, &value, prev_id))?;
        self.conn
            .prepare_cached(
                "INSERT INTO current (key, id) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET id = excluded.id",
            )?
            .execute((&p.key, id))?;
        let prev_kv = if p.prev_kv { prev.as_ref().map(Row::to_kv) } else { None };
        if self.want_events() {
            let row = Row { id, key: p.key, create_rev, version, lease, value };
            events.push(event_of(row, prev));
        }
        Ok(PutResponse { header: Some(ResponseHeader { revision: rev, ..Default::default() }), prev_kv })
    }

    pub(super) fn delete_range(
        &mut self,
        d: &DeleteRangeRequest,
        rev: i64,
        sub: &mut i64,
        events: &mut Vec<Event>,
    ) -> Result<DeleteRangeResponse> {
        let range = KeyRange::new(&d.key, &d.range_end);
        let want_events = self.want_events();
        let rows = read::current_in_range(&self.conn, &range, None, !(d.prev_kv || want_events))?;
        for row in &rows {
            let id = Self::next_id(rev, sub)?;
            self.conn
                .prepare_cached(
                    "INSERT INTO log (id, key, create_rev, version, lease, value, prev_id) VALUES (?1, ?2, 0, 0, 0, x'', ?3)",
                )?
                .execute((id, &row.key, row.id))?;
            // The entry stays, marking the key deleted, until compaction
            // sweeps the tombstone (`read::Latest`).
            self.conn.prepare_cached("UPDATE current SET id = ?2 WHERE key = ?1")?.execute((&row.key, -id))?;
            if want_events {
                let tomb = Row { id, key: row.key.clone(), create_rev: 0, version: 0, lease: 0, value: Vec::new() };
                events.push(event_of(tomb, Some(row.clone())));
            }
        }
        let head = if *sub > 0 { rev } else { self.meta.rev };
        Ok(DeleteRangeResponse {
            header: Some(ResponseHeader { revision: head, ..Default::default() }),
            deleted: rows.len() as i64,
            prev_kvs: if d.prev_kv { rows.into_iter().map(Row::into_kv).collect() } else { Vec::new() },
        })
    }
}

/// Whether an error in `req` always comes before it writes anything: each
/// branch reads and then puts at most one key as its last step (the
/// apiserver's create, update and get). A put fails only before its
/// INSERTs; a storage error rolls the whole batch back anyway. Such a txn
/// needs no savepoint of its own.
pub(super) fn fails_before_writing(req: &TxnRequest) -> bool {
    [&req.success, &req.failure].into_iter().all(|ops| {
        ops.iter().enumerate().all(|(i, op)| match &op.request {
            Some(Request::RequestRange(_)) | None => true,
            Some(Request::RequestPut(_)) => i + 1 == ops.len(),
            Some(Request::RequestDeleteRange(_)) | Some(Request::RequestTxn(_)) => false,
        })
    })
}

fn compare_row(c: &Compare, target: CompareTarget, row: &Row) -> bool {
    use std::cmp::Ordering;
    let ord = match (target, &c.target_union) {
        (CompareTarget::Value, Some(TargetUnion::Value(v))) => row.value.as_slice().cmp(v.as_slice()),
        (CompareTarget::Value, _) => row.value.as_slice().cmp(&[][..]),
        (CompareTarget::Version, u) => row.version.cmp(&int_of(u)),
        (CompareTarget::Create, u) => row.create_rev.cmp(&int_of(u)),
        (CompareTarget::Mod, u) => schema::rev_of(row.id).cmp(&int_of(u)),
        (CompareTarget::Lease, u) => row.lease.cmp(&int_of(u)),
    };
    match CompareResult::try_from(c.result).unwrap_or(CompareResult::Equal) {
        CompareResult::Equal => ord == Ordering::Equal,
        CompareResult::Greater => ord == Ordering::Greater,
        CompareResult::Less => ord == Ordering::Less,
        CompareResult::NotEqual => ord != Ordering::Equal,
    }
}

fn int_of(u: &Option<TargetUnion>) -> i64 {
    match u {
        Some(TargetUnion::Version(v))
        | Some(TargetUnion::CreateRevision(v))
        | Some(TargetUnion::ModRevision(v))
        | Some(TargetUnion::Lease(v)) => *v,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(request: Request) -> RequestOp {
        RequestOp { request: Some(request) }
    }

    #[test]
    fn only_a_lone_final_put_skips_the_savepoint() {
        let put = || op(Request::RequestPut(PutRequest { key: b"k".to_vec(), ..Default::default() }));
        let range = || op(Request::RequestRange(RangeRequest { key: b"k".to_vec(), ..Default::default() }));
        let del = || op(Request::RequestDeleteRange(DeleteRangeRequest { key: b"k".to_vec(), ..Default::default() }));
        let txn = |success: Vec<RequestOp>, failure: Vec<RequestOp>| TxnRequest { compare: vec![], success, failure };
        // The apiserver's create, update and get.
        assert!(fails_before_writing(&txn(vec![put()], vec![])));
        assert!(fails_before_writing(&txn(vec![put()], vec![range()])));
        assert!(fails_before_writing(&txn(vec![range(), put()], vec![range(), range()])));
        // A range after a put may fail (a compacted revision) after it wrote.
        assert!(!fails_before_writing(&txn(vec![put(), range()], vec![])));
        assert!(!fails_before_writing(&txn(vec![put(), put()], vec![])));
        assert!(!fails_before_writing(&txn(vec![], vec![del()])));
        assert!(!fails_before_writing(&txn(vec![op(Request::RequestTxn(txn(vec![put()], vec![])))], vec![])));
    }
}
