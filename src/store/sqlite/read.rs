//! Queries over the revision log. They take a plain connection so that the
//! writer runs them inside its own transaction (seeing its own writes) and
//! readers run them inside a snapshot.

use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection, OptionalExtension, Row as SqlRow};

use super::schema::{first_id, rev_of};
use crate::store::proto::{range_request::SortOrder, range_request::SortTarget, Event, EventType, KeyValue};
use crate::store::proto::{RangeRequest, RangeResponse};
use crate::store::{KeyRange, Result, StoreError};

/// One row of the log, as the newest state of a key.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: i64,
    pub key: Vec<u8>,
    pub create_rev: i64,
    pub version: i64,
    pub lease: i64,
    pub value: Vec<u8>,
}

impl Row {
    fn from_sql(r: &SqlRow<'_>) -> rusqlite::Result<Self> {
        Ok(Row {
            id: r.get(0)?,
            key: r.get(1)?,
            create_rev: r.get(2)?,
            version: r.get(3)?,
            lease: r.get(4)?,
            value: r.get(5)?,
        })
    }

    pub fn to_kv(&self) -> KeyValue {
        KeyValue {
            key: self.key.clone(),
            create_revision: self.create_rev,
            mod_revision: rev_of(self.id),
            version: self.version,
            value: self.value.clone(),
            lease: self.lease,
        }
    }

    pub fn into_kv(self) -> KeyValue {
        KeyValue {
            mod_revision: rev_of(self.id),
            key: self.key,
            create_revision: self.create_rev,
            version: self.version,
            value: self.value,
            lease: self.lease,
        }
    }
}

/// Appends the SQL condition selecting `range` on column `col`.
fn key_cond(col: &str, range: &KeyRange, params: &mut Vec<Value>) -> String {
    match range {
        KeyRange::Single(k) => {
            params.push(Value::Blob(k.clone()));
            format!("{col} = ?{}", params.len())
        }
        KeyRange::Span { start, end } => {
            params.push(Value::Blob(start.clone()));
            let mut cond = format!("{col} >= ?{}", params.len());
            if let Some(end) = end {
                params.push(Value::Blob(end.clone()));
                cond.push_str(&format!(" AND {col} < ?{}", params.len()));
            }
            cond
        }
    }
}

/// What `current` holds for a key, as this connection sees it: its live
/// row, and the id of its newest row, live or a tombstone (0 when the key
/// has none). A deleted key keeps its entry, with the tombstone's id
/// negated, until compaction sweeps the tombstone: the newest row of every
/// key that has one is reachable from `current`, and each row links to the
/// one it superseded (`prev_id`), so the log needs no index by key.
pub struct Latest {
    pub live: Option<Row>,
    pub id: i64,
}

pub fn get_latest(conn: &Connection, key: &[u8]) -> rusqlite::Result<Latest> {
    let found = conn
        .prepare_cached(
            "SELECT c.id, l.id, l.key, l.create_rev, l.version, l.lease, l.value
             FROM current c LEFT JOIN log l ON l.id = c.id AND c.id > 0 WHERE c.key = ?1",
        )?
        .query_row([key], |r| {
            let id: i64 = r.get(0)?;
            let live = match r.get::<_, Option<i64>>(1)? {
                Some(row_id) => Some(Row {
                    id: row_id,
                    key: r.get(2)?,
                    create_rev: r.get(3)?,
                    version: r.get(4)?,
                    lease: r.get(5)?,
                    value: r.get(6)?,
                }),
                None => None,
            };
            Ok(Latest { live, id: id.abs() })
        })
        .optional()?;
    Ok(found.unwrap_or(Latest { live: None, id: 0 }))
}

/// Every live key in `range`, in key order.
pub fn current_in_range(conn: &Connection, range: &KeyRange, limit: Option<i64>, keys_only: bool) -> Result<Vec<Row>> {
    if range.is_empty() {
        return Ok(Vec::new());
    }
    let mut params = Vec::new();
    let cond = key_cond("c.key", range, &mut params);
    params.push(Value::Integer(limit.unwrap_or(-1)));
    let value = if keys_only { "x''" } else { "l.value" };
    let sql = format!(
        "SELECT l.id, l.key, l.create_rev, l.version, l.lease, {value}
         FROM current c JOIN log l ON l.id = c.id WHERE {cond} AND c.id > 0 ORDER BY c.key LIMIT ?{}",
        params.len()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(params_from_iter(params), Row::from_sql)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

fn current_count(conn: &Connection, range: &KeyRange) -> Result<i64> {
    if range.is_empty() {
        return Ok(0);
    }
    let mut params = Vec::new();
    let cond = key_cond("key", range, &mut params);
    let sql = format!("SELECT count(*) FROM current WHERE {cond} AND id > 0");
    Ok(conn.prepare_cached(&sql)?.query_row(params_from_iter(params), |r| r.get(0))?)
}

/// The keys in `range` as they were at revision `rev`, at most `limit`
/// of them: each key that has an entry in `current` (the live ones and those
/// deleted since the last compaction), followed back along `prev_id` to its
/// newest row below `rev + 1`. A key with no such row did not exist yet; a
/// chain that ends at a row compaction removed was deleted by then (the
/// rows compaction removes are tombstones at or below the compact revision,
/// and rows superseded by one at or below it, which a walk from above never
/// passes). The cost is the keys in the range plus the changes made to them
/// since `rev`.
fn historical(conn: &Connection, range: &KeyRange, rev: i64, limit: Option<i64>, keys_only: bool) -> Result<Vec<Row>> {
    let value = if keys_only { "x''" } else { "value" };
    let mut row =
        conn.prepare_cached(&format!("SELECT id, key, create_rev, version, lease, {value} FROM log WHERE id = ?1"))?;
    let mut rows = Vec::new();
    walk_history(conn, range, rev, |id| {
        rows.push(row.query_row([id], Row::from_sql)?);
        Ok(limit.is_none_or(|limit| (rows.len() as i64) < limit))
    })?;
    Ok(rows)
}

fn historical_count(conn: &Connection, range: &KeyRange, rev: i64) -> Result<i64> {
    let mut count = 0;
    walk_history(conn, range, rev, |_| {
        count += 1;
        Ok(true)
    })?;
    Ok(count)
}

/// Calls `found` with the id of each key's live row at `rev`, in key order,
/// until it answers false.
fn walk_history(
    conn: &Connection,
    range: &KeyRange,
    rev: i64,
    mut found: impl FnMut(i64) -> Result<bool>,
) -> Result<()> {
    if range.is_empty() {
        return Ok(());
    }
    let below = first_id(rev + 1);
    let mut params = Vec::new();
    let cond = key_cond("key", range, &mut params);
    let mut entries = conn.prepare_cached(&format!("SELECT abs(id) FROM current WHERE {cond} ORDER BY key"))?;
    let mut entries = entries.query(params_from_iter(params))?;
    let mut link = conn.prepare_cached("SELECT prev_id, version FROM log WHERE id = ?1")?;
    while let Some(entry) = entries.next()? {
        let mut id: i64 = entry.get(0)?;
        loop {
            let Some((prev_id, version)) =
                link.query_row([id], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))).optional()?
            else {
                break;
            };
            if id < below {
                if version > 0 && !found(id)? {
                    return Ok(());
                }
                break;
            }
            if prev_id == 0 {
                break;
            }
            id = prev_id;
        }
    }
    Ok(())
}

/// etcd's Range at `head` (the revision this connection sees), with its
/// rules for revisions, limits, counts, filters and sorting. The header is
/// left for the caller.
pub fn range(conn: &Connection, req: &RangeRequest, head: i64, compact_rev: i64) -> Result<RangeResponse> {
    let rev = if req.revision > 0 { req.revision } else { head };
    if rev > head {
        return Err(StoreError::FutureRevision);
    }
    if rev < compact_rev {
        return Err(StoreError::Compacted { compact_revision: compact_rev });
    }
    let range = KeyRange::new(&req.key, &req.range_end);
    let order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    let sorted = order != SortOrder::None || target != SortTarget::Key;
    let fetch_limit = (req.limit > 0 && !sorted && !filtered).then_some(req.limit + 1);
    let at_head = rev == head;

    let count_query = |conn: &Connection| {
        if at_head {
            current_count(conn, &range)
        } else {
            historical_count(conn, &range, rev)
        }
    };
    if req.count_only {
        return Ok(RangeResponse { header: None, kvs: Vec::new(), more: false, count: count_query(conn)? });
    }
    let mut rows = if at_head {
        current_in_range(conn, &range, fetch_limit, req.keys_only)?
    } else {
        historical(conn, &range, rev, fetch_limit, req.keys_only)?
    };
    let count = match fetch_limit {
        Some(limit) if rows.len() as i64 >= limit => count_query(conn)?,
        _ => rows.len() as i64,
    };
    if filtered {
        rows.retain(|r| {
            let m = rev_of(r.id);
            (req.min_mod_revision == 0 || m >= req.min_mod_revision)
                && (req.max_mod_revision == 0 || m <= req.max_mod_revision)
                && (req.min_create_revision == 0 || r.create_rev >= req.min_create_revision)
                && (req.max_create_revision == 0 || r.create_rev <= req.max_create_revision)
        });
    }
    if sorted {
        let order = if order == SortOrder::None { SortOrder::Ascend } else { order };
        rows.sort_by(|a, b| {
            let ord = match target {
                SortTarget::Key => a.key.cmp(&b.key),
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_rev.cmp(&b.create_rev),
                SortTarget::Mod => a.id.cmp(&b.id),
                SortTarget::Value => a.value.cmp(&b.value),
            };
            if order == SortOrder::Descend {
                ord.reverse()
            } else {
                ord
            }
        });
    }
    let mut more = false;
    if req.limit > 0 && rows.len() as i64 > req.limit {
        rows.truncate(req.limit as usize);
        more = true;
    }
    Ok(RangeResponse { header: None, kvs: rows.into_iter().map(Row::into_kv).collect(), more, count })
}

/// A batch of changes for a watcher catching up from history.
pub struct Changes {
    pub events: Vec<Event>,
    /// The id to continue from.
    pub next_id: i64,
}

/// The changes to keys in `range` with ids in `[from_id, to_id)`, in order,
/// at most `max_rows` of them and about `max_bytes` of values.
pub fn changes(
    conn: &Connection,
    range: &KeyRange,
    from_id: i64,
    to_id: i64,
    max_rows: i64,
    max_bytes: usize,
) -> Result<Changes> {
    let mut params = vec![Value::Integer(from_id), Value::Integer(to_id)];
    let cond = key_cond("l.key", range, &mut params);
    params.push(Value::Integer(max_rows));
    let sql = format!(
        "SELECT l.id, l.key, l.create_rev, l.version, l.lease, l.value,
                p.id, p.create_rev, p.version, p.lease, p.value
         FROM log l LEFT JOIN log p ON p.id = l.prev_id AND l.prev_id != 0 AND p.version > 0
         WHERE l.id >= ?1 AND l.id < ?2 AND {cond} ORDER BY l.id LIMIT ?{}",
        params.len()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(params))?;
    let mut events = Vec::new();
    let mut bytes = 0usize;
    let mut last_id = None;
    let mut cut = false;
    while let Some(r) = rows.next()? {
        let row = Row::from_sql(r)?;
        let prev = match r.get::<_, Option<i64>>(6)? {
            Some(id) => Some(Row {
                id,
                key: row.key.clone(),
                create_rev: r.get(7)?,
                version: r.get(8)?,
                lease: r.get(9)?,
                value: r.get(10)?,
            }),
            None => None,
        };
        bytes += row.value.len() + prev.as_ref().map_or(0, |p| p.value.len());
        last_id = Some(row.id);
        events.push(event_of(row, prev));
        if events.len() as i64 >= max_rows || bytes >= max_bytes {
            cut = true;
            break;
        }
    }
    let next_id = match (cut, last_id) {
        (true, Some(id)) => id + 1,
        _ => to_id,
    };
    Ok(Changes { events, next_id })
}

/// The event a log row stands for: a put, or a delete for a tombstone.
pub fn event_of(row: Row, prev: Option<Row>) -> Event {
    let prev_kv = prev.map(Row::into_kv);
    if row.version == 0 {
        Event {
            r#type: EventType::Delete as i32,
            kv: Some(KeyValue { key: row.key, mod_revision: rev_of(row.id), ..Default::default() }),
            prev_kv,
        }
    } else {
        Event { r#type: EventType::Put as i32, kv: Some(row.into_kv()), prev_kv }
    }
}

/// The live keys attached to a lease.
pub fn lease_keys(conn: &Connection, lease: i64) -> Result<Vec<Vec<u8>>> {
    let mut stmt = conn.prepare_cached(
        "SELECT l.key FROM log l JOIN current c ON c.id = l.id WHERE l.lease = ?1 AND l.lease != 0 ORDER BY l.key",
    )?;
    let keys = stmt.query_map([lease], |r| r.get(0))?;
    Ok(keys.collect::<rusqlite::Result<_>>()?)
}
