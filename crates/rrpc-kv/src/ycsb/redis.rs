//! Redis as a YCSB backend (the baseline of RR-Compound's Table V), shared
//! by `rrpc-kv-bench` and the `kv` benchmark suite so both run exactly the
//! same commands.
//!
//! Unpipelined `GET`/`SET`/`DEL`, one command per operation. Workload E's
//! scans are emulated as YCSB's Redis binding does: every `SET` also adds
//! the key to a sorted set (`ZADD rrpc-kv:index 0 key`), every `DEL`
//! removes it, and a scan is `ZRANGE rrpc-kv:index [start + BYLEX LIMIT 0
//! n` then `MGET`. The index is kept only when `index` is set (the
//! workload scans), so A-D and F cost one command per operation.

use bytes::Bytes;
use redis::aio::ConnectionLike;

use crate::{Op, OpResult};

/// The sorted set that indexes keys for scans.
pub const INDEX: &str = "rrpc-kv:index";

/// Carries out `op` on Redis. `Err` is Redis's (or the connection's)
/// error; a scan without the index is `Ok(OpResult::Failed(..))`.
///
/// # Cancel safety
/// Not cancel safe: a cancelled call may leave a `SET` applied without its
/// `ZADD`.
///
/// # Errors
/// The connection's or the server's [`redis::RedisError`].
pub async fn execute<C: ConnectionLike + Send>(
    conn: &mut C,
    index: bool,
    op: Op,
) -> Result<OpResult, redis::RedisError> {
    Ok(match op {
        Op::Get { key } => {
            let v: Option<Vec<u8>> = redis::cmd("GET").arg(&key[..]).query_async(conn).await?;
            v.map_or(OpResult::NotFound, |v| OpResult::Value(v.into()))
        }
        Op::Put { key, value } => {
            let () = redis::cmd("SET")
                .arg(&key[..])
                .arg(&value[..])
                .query_async(conn)
                .await?;
            if index {
                let _: i64 = redis::cmd("ZADD")
                    .arg(INDEX)
                    .arg(0)
                    .arg(&key[..])
                    .query_async(conn)
                    .await?;
            }
            OpResult::Ok
        }
        Op::Delete { key } => {
            let n: i64 = redis::cmd("DEL").arg(&key[..]).query_async(conn).await?;
            if index {
                let _: i64 = redis::cmd("ZREM")
                    .arg(INDEX)
                    .arg(&key[..])
                    .query_async(conn)
                    .await?;
            }
            if n > 0 {
                OpResult::Ok
            } else {
                OpResult::NotFound
            }
        }
        Op::Scan { start, count } => {
            if !index {
                return Ok(OpResult::Failed(
                    "scan on Redis needs the key index, kept only for workloads that scan".into(),
                ));
            }
            if count == 0 {
                return Ok(OpResult::Entries(vec![]));
            }
            let mut min = b"[".to_vec();
            min.extend_from_slice(&start);
            let keys: Vec<Vec<u8>> = redis::cmd("ZRANGE")
                .arg(INDEX)
                .arg(min)
                .arg("+")
                .arg("BYLEX")
                .arg("LIMIT")
                .arg(0)
                .arg(count)
                .query_async(conn)
                .await?;
            if keys.is_empty() {
                return Ok(OpResult::Entries(vec![]));
            }
            let values: Vec<Option<Vec<u8>>> =
                redis::cmd("MGET").arg(&keys).query_async(conn).await?;
            OpResult::Entries(
                keys.into_iter()
                    .zip(values)
                    .filter_map(|(k, v)| Some((Bytes::from(k), Bytes::from(v?))))
                    .collect(),
            )
        }
    })
}
