//! Pure choices and checks against what a device reports: which port and
//! GID index to use, whether a queue pair's sizes fit the device's limits,
//! and the search for the device's largest inline size.
//!
//! Nothing here calls libibverbs: the device layer ([`super::device`])
//! queries the device and passes the numbers (or a lookup closure) in, so
//! every rule is unit-tested on machines without RDMA hardware.

use std::path::Path;

use crate::error::{Error, Result};

/// `IBV_LINK_LAYER_ETHERNET` (`ibv_port_attr::link_layer` of a RoCE port;
/// an anonymous enum in `verbs.h` that bindgen does not export; checked
/// against the header by the ABI test).
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

/// The limits of a device that rrpc-core checks (`ibv_query_device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceCaps {
    /// Physical ports, numbered `1..=phys_port_cnt`.
    pub(crate) phys_port_cnt: u8,
    /// Largest send or receive queue (`max_qp_wr`).
    pub(crate) max_qp_wr: u32,
    /// Largest completion queue (`max_cqe`).
    pub(crate) max_cqe: u32,
}

/// Checks that `port` is one of the device's ports.
///
/// # Errors
/// [`Error::InvalidConfig`] naming the port asked for and the ports that exist.
pub(crate) fn check_port(device: &str, port: u8, caps: &DeviceCaps) -> Result<()> {
    if port == 0 || port > caps.phys_port_cnt {
        return Err(Error::InvalidConfig(format!(
            "port {port} out of device {device}'s ports 1..={}",
            caps.phys_port_cnt
        )));
    }
    Ok(())
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GidEntry {
    /// The GID (all zero: an empty entry).
    pub(crate) gid: [u8; 16],
    /// Whether sysfs says the entry is `RoCE v2` (`false` when it says
    /// otherwise or the file cannot be read).
    pub(crate) roce_v2: bool,
}

impl GidEntry {
    fn is_empty(&self) -> bool {
        self.gid == [0; 16]
    }
}

/// Whether `gid` is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`): the GID
/// of an IPv4 address on a RoCE port.
pub(crate) fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff]
}

/// The GID index a fabric uses.
///
/// * `requested`: that index; it must lie in the port's table
///   (`table_len` entries, from `ibv_query_port`'s `gid_tbl_len`) and must
///   not be empty.
/// * `None` on a RoCE port (`scan` true): the first entry that is an
///   IPv4-mapped GID of type RoCE v2 — routable over IP, what most RoCE
///   deployments use — else index 0.
/// * `None` otherwise (InfiniBand): index 0.
///
/// `lookup(i)` reads entry `i` (`ibv_query_gid` and the sysfs type).
/// Indices above 255 are never used (`sgid_index` is a byte).
///
/// # Errors
/// [`Error::InvalidConfig`] naming the index asked for and the table's
/// length (or its non-empty entries); the errors of `lookup`.
pub(crate) fn choose_gid_index(
    location: &str,
    requested: Option<u8>,
    table_len: u32,
    scan: bool,
    mut lookup: impl FnMut(u8) -> Result<GidEntry>,
) -> Result<u8> {
    if table_len == 0 {
        return Err(Error::InvalidConfig(format!(
            "{location} has an empty GID table"
        )));
    }
    // The last index a byte can name.
    let last = u8::try_from(table_len.min(256) - 1).unwrap_or(u8::MAX);
    match requested {
        Some(i) if u32::from(i) >= table_len => Err(Error::InvalidConfig(format!(
            "gid index {i} out of the port's table of {table_len} ({location})"
        ))),
        Some(i) => {
            if !lookup(i)?.is_empty() {
                return Ok(i);
            }
            let mut used = Vec::new();
            for j in 0..=last {
                if !lookup(j)?.is_empty() {
                    used.push(j.to_string());
                }
            }
            Err(Error::InvalidConfig(format!(
                "gid index {i} is an empty entry of the port's table of {table_len} ({location}; \
                 non-empty: {})",
                if used.is_empty() {
                    "none".to_owned()
                } else {
                    used.join(", ")
                }
            )))
        }
        None if scan => {
            for j in 0..=last {
                let e = lookup(j)?;
                if e.roce_v2 && is_ipv4_mapped(&e.gid) {
                    return Ok(j);
                }
            }
            Ok(0)
        }
        None => Ok(0),
    }
}

/// The type of GID `index` of `device`'s `port` as sysfs names it
/// (`<sysfs>/<device>/ports/<port>/gid_attrs/types/<index>`, e.g.
/// `RoCE v2` or `IB/RoCE v1`), or `None` when the file cannot be read (no
/// such attribute on this kernel, or an empty entry).
pub(crate) fn sysfs_gid_type(sysfs: &Path, device: &str, port: u8, index: u8) -> Option<String> {
    let p = sysfs
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("gid_attrs/types")
        .join(index.to_string());
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

/// The sizes of one queue pair as it will be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpSizes {
    /// `max_send_wr`, also the send completion queue's entries.
    pub(crate) send_depth: u32,
    /// `max_recv_wr` (the configured depth rounded up to a power of two),
    /// also the receive completion queue's entries.
    pub(crate) recv_depth: u32,
}

/// Checks a queue pair's depths against the device's limits.
///
/// # Errors
/// [`Error::InvalidConfig`] naming the configured value and the device's
/// limit (`max_qp_wr` for both queues, `max_cqe` for their completion
/// queues).
pub(crate) fn check_qp_sizes(device: &str, s: QpSizes, caps: &DeviceCaps) -> Result<()> {
    let over = |what: &str, v: u32, limit_name: &str, limit: u32| -> Result<()> {
        if v > limit {
            return Err(Error::InvalidConfig(format!(
                "{what} {v} exceeds device {device}'s {limit_name} of {limit}"
            )));
        }
        Ok(())
    };
    over("send_depth", s.send_depth, "max_qp_wr", caps.max_qp_wr)?;
    over(
        "recv_depth (rounded up to a power of two)",
        s.recv_depth,
        "max_qp_wr",
        caps.max_qp_wr,
    )?;
    over(
        "send completion queue of send_depth",
        s.send_depth,
        "max_cqe",
        caps.max_cqe,
    )?;
    over(
        "receive completion queue of recv_depth",
        s.recv_depth,
        "max_cqe",
        caps.max_cqe,
    )
}

/// The largest inline size below `refused` that `works` accepts, by
/// bisection (at most `log2(refused)` calls), given that `works(0)` holds
/// and `works(refused)` does not. libibverbs reports no `max_inline_data`
/// for a device; the only way to learn it is to ask `ibv_create_qp`.
///
/// # Errors
/// The first error of `works` other than a refusal (`Ok(false)`).
pub(crate) fn largest_inline(
    refused: u32,
    mut works: impl FnMut(u32) -> Result<bool>,
) -> Result<u32> {
    let (mut lo, mut hi) = (0u32, refused);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if works(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: DeviceCaps = DeviceCaps {
        phys_port_cnt: 2,
        max_qp_wr: 16384,
        max_cqe: 32767,
    };

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    fn link_local() -> [u8; 16] {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..].copy_from_slice(&[2, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55]);
        g
    }

    /// A RoCE table as mlx5 lays it out: per address a v1 and a v2 entry.
    fn table() -> Vec<GidEntry> {
        let e = |gid, roce_v2| GidEntry { gid, roce_v2 };
        vec![
            e(link_local(), false),
            e(link_local(), true),
            e(v4([10, 0, 0, 7]), false),
            e(v4([10, 0, 0, 7]), true),
            e([0; 16], false),
        ]
    }

    fn lookup_in(t: &[GidEntry]) -> impl FnMut(u8) -> Result<GidEntry> + '_ {
        |i| Ok(t[usize::from(i)])
    }

    fn msg(r: Result<u8>) -> String {
        match r {
            Err(e @ Error::InvalidConfig(_)) => e.to_string(),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn ports_are_numbered_from_one() {
        assert!(check_port("mlx5_0", 1, &CAPS).is_ok());
        assert!(check_port("mlx5_0", 2, &CAPS).is_ok());
        for p in [0, 3] {
            let e = check_port("mlx5_0", p, &CAPS).unwrap_err().to_string();
            assert!(
                e.contains(&format!("port {p} out of device mlx5_0's ports 1..=2")),
                "{e}"
            );
        }
    }

    #[test]
    fn the_default_prefers_an_ipv4_mapped_roce_v2_gid() {
        let t = table();
        assert_eq!(
            choose_gid_index("d", None, 5, true, lookup_in(&t)).unwrap(),
            3
        );
        // soft-RoCE: every entry is v2, the IPv4 one comes second.
        let rxe = [
            GidEntry {
                gid: link_local(),
                roce_v2: true,
            },
            GidEntry {
                gid: v4([10, 99, 0, 1]),
                roce_v2: true,
            },
        ];
        assert_eq!(
            choose_gid_index("d", None, 2, true, lookup_in(&rxe)).unwrap(),
            1
        );
    }

    #[test]
    fn the_default_falls_back_to_index_0() {
        // No IPv4 address on the port (loopback-only rxe, IPv6 only).
        let t = [
            GidEntry {
                gid: link_local(),
                roce_v2: true,
            },
            GidEntry {
                gid: [0; 16],
                roce_v2: false,
            },
        ];
        assert_eq!(
            choose_gid_index("d", None, 2, true, lookup_in(&t)).unwrap(),
            0
        );
        // An IPv4 GID of an unknown type (no sysfs attribute) is not preferred.
        let t = [
            GidEntry {
                gid: link_local(),
                roce_v2: false,
            },
            GidEntry {
                gid: v4([10, 0, 0, 1]),
                roce_v2: false,
            },
        ];
        assert_eq!(
            choose_gid_index("d", None, 2, true, lookup_in(&t)).unwrap(),
            0
        );
        // InfiniBand: no scan at all.
        let mut calls = 0;
        let got = choose_gid_index("d", None, 128, false, |_| {
            calls += 1;
            Ok(table()[3])
        });
        assert_eq!((got.unwrap(), calls), (0, 0));
    }

    #[test]
    fn a_requested_index_is_checked() {
        let t = table();
        assert_eq!(
            choose_gid_index("d", Some(2), 5, true, lookup_in(&t)).unwrap(),
            2
        );
        assert_eq!(
            choose_gid_index("d", Some(0), 5, false, lookup_in(&t)).unwrap(),
            0
        );
        let e = msg(choose_gid_index(
            "rxe0 port 1",
            Some(7),
            4,
            true,
            lookup_in(&t),
        ));
        assert!(
            e.contains("gid index 7 out of the port's table of 4 (rxe0 port 1)"),
            "{e}"
        );
        let e = msg(choose_gid_index(
            "rxe0 port 1",
            Some(4),
            5,
            true,
            lookup_in(&t),
        ));
        assert!(e.contains("gid index 4 is an empty entry"), "{e}");
        assert!(e.contains("non-empty: 0, 1, 2, 3"), "{e}");
        let e = msg(choose_gid_index("d", None, 0, true, lookup_in(&t)));
        assert!(e.contains("empty GID table"), "{e}");
    }

    #[test]
    fn lookup_errors_pass_through() {
        let r = choose_gid_index("d", None, 4, true, |_| {
            Err(Error::io("ibv_query_gid", std::io::Error::other("boom")))
        });
        assert!(matches!(
            r,
            Err(Error::Io {
                op: "ibv_query_gid",
                ..
            })
        ));
    }

    #[test]
    fn large_tables_stop_at_index_255() {
        let mut seen = 0u32;
        let got = choose_gid_index("d", None, 1000, true, |i| {
            seen += 1;
            Ok(GidEntry {
                gid: if i == 255 { v4([1, 2, 3, 4]) } else { [0; 16] },
                roce_v2: true,
            })
        });
        assert_eq!((got.unwrap(), seen), (255, 256));
    }

    #[test]
    fn ipv4_mapped_gids() {
        assert!(is_ipv4_mapped(&v4([10, 99, 0, 1])));
        assert!(!is_ipv4_mapped(&link_local()));
        assert!(!is_ipv4_mapped(&[0; 16]));
        let mut nearly = v4([1, 1, 1, 1]);
        nearly[9] = 1;
        assert!(!is_ipv4_mapped(&nearly));
    }

    #[test]
    fn gid_types_come_from_sysfs() {
        let root = std::env::temp_dir().join(format!("rrpc-sysfs-{}", std::process::id()));
        let types = root.join("rxe0/ports/1/gid_attrs/types");
        std::fs::create_dir_all(&types).unwrap();
        std::fs::write(types.join("0"), "IB/RoCE v1\n").unwrap();
        std::fs::write(types.join("1"), "RoCE v2\n").unwrap();
        assert_eq!(
            sysfs_gid_type(&root, "rxe0", 1, 0).as_deref(),
            Some("IB/RoCE v1")
        );
        assert_eq!(
            sysfs_gid_type(&root, "rxe0", 1, 1).as_deref(),
            Some("RoCE v2")
        );
        assert_eq!(sysfs_gid_type(&root, "rxe0", 1, 2), None);
        assert_eq!(sysfs_gid_type(&root, "rxe0", 2, 1), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn depths_are_checked_against_the_device() {
        let ok = QpSizes {
            send_depth: 1024,
            recv_depth: 1024,
        };
        assert!(check_qp_sizes("rxe0", ok, &CAPS).is_ok());
        let at_limit = QpSizes {
            send_depth: 16384,
            recv_depth: 16384,
        };
        assert!(check_qp_sizes("rxe0", at_limit, &CAPS).is_ok());
        let e = check_qp_sizes(
            "rxe0",
            QpSizes {
                send_depth: 20000,
                recv_depth: 1024,
            },
            &CAPS,
        )
        .unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)));
        assert!(
            e.to_string()
                .contains("send_depth 20000 exceeds device rxe0's max_qp_wr of 16384"),
            "{e}"
        );
        let e = check_qp_sizes(
            "rxe0",
            QpSizes {
                send_depth: 1024,
                recv_depth: 32768,
            },
            &CAPS,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("recv_depth"), "{e}");
        assert!(
            e.contains("32768 exceeds device rxe0's max_qp_wr of 16384"),
            "{e}"
        );
        let small_cq = DeviceCaps {
            max_cqe: 512,
            ..CAPS
        };
        let e = check_qp_sizes("d", ok, &small_cq).unwrap_err().to_string();
        assert!(e.contains("1024 exceeds device d's max_cqe of 512"), "{e}");
    }

    #[test]
    fn bisection_finds_the_largest_inline_size() {
        for max in [0u32, 1, 31, 32, 63, 100, 230] {
            let mut calls = 0;
            let got = largest_inline(256, |n| {
                calls += 1;
                Ok(n <= max)
            })
            .unwrap();
            assert_eq!(got, max);
            assert!(calls <= 8, "{calls} calls for max {max}");
        }
        assert_eq!(largest_inline(1, |_| unreachable!()).unwrap(), 0);
        let r = largest_inline(64, |_| Err(Error::WouldBlock));
        assert!(matches!(r, Err(Error::WouldBlock)));
    }
}
