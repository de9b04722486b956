//! The verbs queue pair's address ([`QpAddress`]) carried in the
//! handshake's `Hello.endpoint`:
//! what the peer needs to move its queue pair to RTR towards ours.
//!
//! ```text
//! lid u16 | qpn u32 | psn u32 | gid [u8; 16] | mtu u8     (27 bytes, little endian)
//! ```
//!
//! `mtu` is the active MTU of the sender's port as an `ibv_mtu` code (1 = 256
//! bytes … 5 = 4096 bytes); each side moves its queue pair to RTR with the
//! smaller of its own port's active MTU and the peer's ([`path_mtu`]).
//! The 26-byte layout of earlier versions (no MTU) is refused with a message
//! saying so.

use rdma_sys::ibv_mtu;

use crate::error::{Error, Result};

/// Encoded length of a [`QpAddress`].
pub(crate) const ENDPOINT_LEN: usize = 27;

/// Length of the address before the MTU byte was added (refused by
/// [`QpAddress::decode`] with a message naming the old layout).
pub(crate) const OLD_ENDPOINT_LEN: usize = 26;

/// Largest queue pair number / packet sequence number (24 bits on the wire).
const MAX_24: u32 = 0x00ff_ffff;

/// Bytes of an `ibv_mtu` code (`IBV_MTU_256` = 1 … `IBV_MTU_4096` = 5), or
/// `None` for a value that is not one.
pub(crate) fn mtu_bytes(code: u32) -> Option<u32> {
    (ibv_mtu::IBV_MTU_256..=ibv_mtu::IBV_MTU_4096)
        .contains(&code)
        .then(|| 128 << code)
}

/// The path MTU of a connection: the smaller of our port's active MTU and
/// the peer's (both `ibv_mtu` codes, so the smaller code is the smaller MTU).
///
/// # Errors
/// [`Error::MalformedHandshake`] if `peer` is not an `ibv_mtu` code;
/// [`Error::InvalidConfig`] if `local` is not (the port reported nonsense).
pub(crate) fn path_mtu(local: u32, peer: u32) -> Result<u32> {
    if mtu_bytes(local).is_none() {
        return Err(Error::InvalidConfig(format!(
            "local port's active MTU code {local} is not an ibv_mtu code (1..=5, 256..=4096 bytes)"
        )));
    }
    if mtu_bytes(peer).is_none() {
        return Err(Error::MalformedHandshake(format!(
            "peer's MTU code {peer} is not an ibv_mtu code (1..=5, 256..=4096 bytes)"
        )));
    }
    Ok(local.min(peer))
}

/// Address of one RC queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpAddress {
    /// Local identifier of the port (InfiniBand; 0 on RoCE).
    pub(crate) lid: u16,
    /// Queue pair number (24 bits).
    pub(crate) qpn: u32,
    /// Starting packet sequence number of our send queue (24 bits).
    pub(crate) psn: u32,
    /// Port GID (needed on RoCE and routed InfiniBand; zero otherwise).
    pub(crate) gid: [u8; 16],
    /// Active MTU of the port, an `ibv_mtu` code (1..=5); one byte on the wire.
    pub(crate) mtu: u32,
}

impl QpAddress {
    /// The 27-byte wire form.
    ///
    /// # Panics
    /// In debug builds, if `mtu` is not an `ibv_mtu` code (the device layer
    /// validates the port's MTU when it opens the device).
    pub(crate) fn encode(&self) -> Vec<u8> {
        debug_assert!(mtu_bytes(self.mtu).is_some(), "MTU code {}", self.mtu);
        let mut out = Vec::with_capacity(ENDPOINT_LEN);
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.extend_from_slice(&self.qpn.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out.extend_from_slice(&self.gid);
        out.push(u8::try_from(self.mtu).unwrap_or(0));
        out
    }

    /// Parses and validates the wire form sent by a peer.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] for a wrong length (the 26-byte layout of
    /// earlier versions, without the MTU, is named as such), a QPN or PSN
    /// wider than 24 bits, an endpoint with neither LID nor GID (unroutable),
    /// or an MTU byte that is not an `ibv_mtu` code (1..=5).
    pub(crate) fn decode(b: &[u8]) -> Result<QpAddress> {
        if b.len() == OLD_ENDPOINT_LEN {
            return Err(Error::MalformedHandshake(format!(
                "verbs endpoint is {OLD_ENDPOINT_LEN} bytes, the layout without a path MTU \
                 (peer runs an older rrpc); this version needs {ENDPOINT_LEN} bytes"
            )));
        }
        if b.len() != ENDPOINT_LEN {
            return Err(Error::MalformedHandshake(format!(
                "verbs endpoint must be {ENDPOINT_LEN} bytes, got {}",
                b.len()
            )));
        }
        let lid = u16::from_le_bytes([b[0], b[1]]);
        let qpn = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let psn = u32::from_le_bytes([b[6], b[7], b[8], b[9]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[10..26]);
        let mtu = u32::from(b[26]);
        if qpn > MAX_24 || psn > MAX_24 {
            return Err(Error::MalformedHandshake(format!(
                "verbs endpoint QPN {qpn:#x} / PSN {psn:#x} exceed 24 bits"
            )));
        }
        if lid == 0 && gid == [0; 16] {
            return Err(Error::MalformedHandshake(
                "verbs endpoint has neither a LID nor a GID".into(),
            ));
        }
        if mtu_bytes(mtu).is_none() {
            return Err(Error::MalformedHandshake(format!(
                "verbs endpoint MTU code {mtu} is not an ibv_mtu code (1..=5, 256..=4096 bytes)"
            )));
        }
        Ok(QpAddress {
            lid,
            qpn,
            psn,
            gid,
            mtu,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_fixed() {
        let e = QpAddress {
            lid: 0x0102,
            qpn: 0x0003_0405,
            psn: 0x0006_0708,
            gid: [0xaa; 16],
            mtu: ibv_mtu::IBV_MTU_1024,
        };
        let b = e.encode();
        assert_eq!(b.len(), ENDPOINT_LEN);
        assert_eq!(&b[..10], &[2, 1, 5, 4, 3, 0, 8, 7, 6, 0]);
        assert_eq!(&b[10..26], &[0xaa; 16]);
        assert_eq!(b[26], 3, "IBV_MTU_1024");
        assert_eq!(QpAddress::decode(&b).unwrap(), e);
    }

    fn good() -> Vec<u8> {
        QpAddress {
            lid: 1,
            qpn: 2,
            psn: 3,
            gid: [0; 16],
            mtu: ibv_mtu::IBV_MTU_4096,
        }
        .encode()
    }

    fn message(r: Result<QpAddress>) -> String {
        match r {
            Err(e @ Error::MalformedHandshake(_)) => e.to_string(),
            other => panic!("expected MalformedHandshake, got {other:?}"),
        }
    }

    #[test]
    fn bad_endpoints_are_refused() {
        let good = good();
        assert!(QpAddress::decode(&good).is_ok());
        for cut in [0, 1, 25] {
            let m = message(QpAddress::decode(&good[..cut]));
            assert!(m.contains(&format!("must be 27 bytes, got {cut}")), "{m}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(message(QpAddress::decode(&long)).contains("got 28"));
        let mut wide = good.clone();
        wide[5] = 1; // QPN high byte
        assert!(QpAddress::decode(&wide).is_err());
        let mut wide = good.clone();
        wide[9] = 1; // PSN high byte
        assert!(QpAddress::decode(&wide).is_err());
        let mut nowhere = good;
        nowhere[0] = 0; // LID 0 and GID 0
        assert!(QpAddress::decode(&nowhere).is_err());
    }

    #[test]
    fn the_layout_without_an_mtu_is_named() {
        let old = &good()[..OLD_ENDPOINT_LEN];
        let m = message(QpAddress::decode(old));
        assert!(m.contains("26 bytes"), "{m}");
        assert!(m.contains("without a path MTU"), "{m}");
        assert!(m.contains("27 bytes"), "{m}");
    }

    #[test]
    fn bad_mtu_codes_are_refused_naming_the_code() {
        for code in [0u8, 6, 7, 0xff] {
            let mut b = good();
            b[26] = code;
            let m = message(QpAddress::decode(&b));
            assert!(m.contains(&format!("MTU code {code} ")), "{m}");
        }
        for code in 1u8..=5 {
            let mut b = good();
            b[26] = code;
            assert_eq!(QpAddress::decode(&b).unwrap().mtu, u32::from(code));
        }
    }

    #[test]
    fn mtu_codes_map_to_bytes() {
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_256), Some(256));
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_512), Some(512));
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_1024), Some(1024));
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_2048), Some(2048));
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_4096), Some(4096));
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_bytes(6), None);
    }

    #[test]
    fn path_mtu_is_the_smaller_of_the_two() {
        use ibv_mtu::*;
        assert_eq!(path_mtu(IBV_MTU_4096, IBV_MTU_1024).unwrap(), IBV_MTU_1024);
        assert_eq!(path_mtu(IBV_MTU_1024, IBV_MTU_4096).unwrap(), IBV_MTU_1024);
        assert_eq!(path_mtu(IBV_MTU_2048, IBV_MTU_2048).unwrap(), IBV_MTU_2048);
        assert_eq!(path_mtu(IBV_MTU_256, IBV_MTU_4096).unwrap(), IBV_MTU_256);
        let e = path_mtu(IBV_MTU_1024, 9).unwrap_err();
        assert!(matches!(e, Error::MalformedHandshake(_)), "{e}");
        assert!(e.to_string().contains("peer's MTU code 9"), "{e}");
        let e = path_mtu(0, IBV_MTU_1024).unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
        assert!(e.to_string().contains("MTU code 0"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn round_trips(
            lid in 1u16..,
            qpn in 0u32..=MAX_24,
            psn in 0u32..=MAX_24,
            gid in any::<[u8; 16]>(),
            mtu in 1u32..=5,
        ) {
            let e = QpAddress { lid, qpn, psn, gid, mtu };
            prop_assert_eq!(QpAddress::decode(&e.encode()).unwrap(), e);
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = QpAddress::decode(&b);
        }

        #[test]
        fn path_mtu_is_symmetric_and_never_above_either(a in 1u32..=5, b in 1u32..=5) {
            let m = path_mtu(a, b).unwrap();
            prop_assert_eq!(m, path_mtu(b, a).unwrap());
            prop_assert!(mtu_bytes(m).unwrap() <= mtu_bytes(a).unwrap().min(mtu_bytes(b).unwrap()));
            prop_assert!(m == a || m == b);
        }
    }
}
