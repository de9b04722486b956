//! The persistent engine: one redb database per partition, every PUT and
//! DELETE committed with immediate durability (see the module docs of
//! [`crate::store`]).

use std::collections::BTreeSet;
use std::fmt::Display;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::shared::{MAX_PARTITIONS, PartitionStats};
use crate::error::{Error, Result};

const TABLE: TableDefinition<'static, &'static [u8], &'static [u8]> = TableDefinition::new("kv");

fn storage(e: impl Display) -> Error {
    Error::Storage(e.to_string())
}

fn file_name(i: usize, n: usize) -> String {
    format!("part-{i}-of-{n}.redb")
}

/// The `n` of a `part-<i>-of-<n>.redb` file name.
fn parse_n(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("part-")?.strip_suffix(".redb")?;
    let (i, n) = rest.split_once("-of-")?;
    i.parse::<usize>().ok()?;
    n.parse().ok()
}

/// The number of partitions of the store in `dir` (created if missing):
/// the directory's if it has partition files, else `explicit` or `default`.
pub(super) fn partitions_of(dir: &Path, explicit: Option<usize>, default: usize) -> Result<usize> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        op: "create the store directory",
        source,
    })?;
    let mut found = BTreeSet::new();
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        op: "read the store directory",
        source,
    })?;
    for e in entries {
        let e = e.map_err(|source| Error::Io {
            op: "read the store directory",
            source,
        })?;
        if let Some(n) = e.file_name().to_str().and_then(parse_n) {
            found.insert(n);
        }
    }
    let dir_s = dir.display();
    match (found.len(), found.first().copied(), explicit) {
        (0, _, Some(n)) => Ok(n),
        (0, _, None) => Ok(default),
        (1, Some(n), _) if !(1..=MAX_PARTITIONS).contains(&n) => Err(Error::InvalidConfig(
            format!("store {dir_s} has {n} partitions, out of 1..={MAX_PARTITIONS}"),
        )),
        (1, Some(n), None) => Ok(n),
        (1, Some(n), Some(m)) if n == m => Ok(n),
        (1, Some(n), Some(m)) => Err(Error::InvalidConfig(format!(
            "store {dir_s} was created with {n} partitions, the configuration asks for {m}"
        ))),
        _ => Err(Error::InvalidConfig(format!(
            "store {dir_s} holds files of several partition counts: {found:?}"
        ))),
    }
}

#[derive(Debug)]
pub(super) struct DiskPartition {
    path: PathBuf,
    db: Database,
    hits: u64,
    misses: u64,
    bytes: usize,
    entries: usize,
}

impl DiskPartition {
    /// Opens (creating if missing) partition `i` of `n` in `dir`, with
    /// `cache` bytes of redb page cache. Reads the table once to count its
    /// entries and bytes.
    pub(super) fn open(dir: &Path, i: usize, n: usize, cache: usize) -> Result<Self> {
        let path = dir.join(file_name(i, n));
        let db = redb::Builder::new()
            .set_cache_size(cache)
            .create(&path)
            .map_err(|e| Error::Storage(format!("open {}: {e}", path.display())))?;
        let mut txn = db.begin_write().map_err(storage)?;
        txn.set_durability(Durability::Immediate).map_err(storage)?;
        txn.open_table(TABLE).map_err(storage)?;
        txn.commit().map_err(storage)?;
        let (mut bytes, mut entries) = (0, 0);
        {
            let txn = db.begin_read().map_err(storage)?;
            let table = txn.open_table(TABLE).map_err(storage)?;
            for e in table.iter().map_err(storage)? {
                let (k, v) = e.map_err(storage)?;
                bytes += k.value().len() + v.value().len();
                entries += 1;
            }
        }
        Ok(DiskPartition {
            path,
            db,
            hits: 0,
            misses: 0,
            bytes,
            entries,
        })
    }

    pub(super) fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(TABLE).map_err(storage)?;
        let v = table
            .get(key)
            .map_err(storage)?
            .map(|v| Bytes::copy_from_slice(v.value()));
        if v.is_some() {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        Ok(v)
    }

    pub(super) fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_durability(Durability::Immediate).map_err(storage)?;
        let old = {
            let mut table = txn.open_table(TABLE).map_err(storage)?;
            table
                .insert(key, value)
                .map_err(storage)?
                .map(|old| old.value().len())
        };
        txn.commit()
            .map_err(|e| Error::Storage(format!("commit to {}: {e}", self.path.display())))?;
        match old {
            Some(old) => self.bytes = self.bytes + value.len() - old,
            None => {
                self.bytes += key.len() + value.len();
                self.entries += 1;
            }
        }
        Ok(())
    }

    pub(super) fn delete(&mut self, key: &[u8]) -> Result<bool> {
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_durability(Durability::Immediate).map_err(storage)?;
        let old = {
            let mut table = txn.open_table(TABLE).map_err(storage)?;
            table
                .remove(key)
                .map_err(storage)?
                .map(|old| old.value().len())
        };
        match old {
            Some(old) => {
                txn.commit().map_err(|e| {
                    Error::Storage(format!("commit to {}: {e}", self.path.display()))
                })?;
                self.bytes -= key.len() + old;
                self.entries -= 1;
                Ok(true)
            }
            None => {
                txn.abort().map_err(storage)?;
                Ok(false)
            }
        }
    }

    pub(super) fn scan(&mut self, start: &[u8], count: usize) -> Result<Vec<(Bytes, Bytes)>> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(TABLE).map_err(storage)?;
        let mut out = Vec::with_capacity(count.min(1024));
        for e in table.range(start..).map_err(storage)?.take(count) {
            let (k, v) = e.map_err(storage)?;
            out.push((
                Bytes::copy_from_slice(k.value()),
                Bytes::copy_from_slice(v.value()),
            ));
        }
        Ok(out)
    }

    pub(super) fn stats(&self) -> PartitionStats {
        PartitionStats {
            hits: self.hits,
            misses: self.misses,
            evictions: 0,
            bytes: self.bytes,
            entries: self.entries,
            bound: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip() {
        assert_eq!(parse_n(&file_name(3, 8)), Some(8));
        assert_eq!(parse_n("part-x-of-8.redb"), None);
        assert_eq!(parse_n("other.redb"), None);
    }
}
