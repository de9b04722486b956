//! The verbs queue-pair endpoint carried in the handshake's `Hello.endpoint`:
//! what the peer needs to move its queue pair to RTR towards ours.
//!
//! ```text
//! lid u16 | qpn u32 | psn u32 | gid [u8; 16]        (26 bytes, little endian)
//! ```

use crate::error::{Error, Result};

/// Encoded length of a [`VerbsEndpoint`].
pub(crate) const ENDPOINT_LEN: usize = 26;

/// Largest queue pair number / packet sequence number (24 bits on the wire).
const MAX_24: u32 = 0x00ff_ffff;

/// Address of one RC queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VerbsEndpoint {
    /// Local identifier of the port (InfiniBand; 0 on RoCE).
    pub(crate) lid: u16,
    /// Queue pair number (24 bits).
    pub(crate) qpn: u32,
    /// Starting packet sequence number of our send queue (24 bits).
    pub(crate) psn: u32,
    /// Port GID (needed on RoCE and routed InfiniBand; zero otherwise).
    pub(crate) gid: [u8; 16],
}

impl VerbsEndpoint {
    /// The 26-byte wire form.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENDPOINT_LEN);
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.extend_from_slice(&self.qpn.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out.extend_from_slice(&self.gid);
        out
    }

    /// Parses and validates the wire form sent by a peer.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] for a wrong length, a QPN or PSN wider than
    /// 24 bits, or an endpoint with neither LID nor GID (unroutable).
    pub(crate) fn decode(b: &[u8]) -> Result<VerbsEndpoint> {
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
        Ok(VerbsEndpoint { lid, qpn, psn, gid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_fixed() {
        let e = VerbsEndpoint {
            lid: 0x0102,
            qpn: 0x0003_0405,
            psn: 0x0006_0708,
            gid: [0xaa; 16],
        };
        let b = e.encode();
        assert_eq!(b.len(), ENDPOINT_LEN);
        assert_eq!(&b[..10], &[2, 1, 5, 4, 3, 0, 8, 7, 6, 0]);
        assert_eq!(&b[10..], &[0xaa; 16]);
        assert_eq!(VerbsEndpoint::decode(&b).unwrap(), e);
    }

    #[test]
    fn bad_endpoints_are_refused() {
        let good = VerbsEndpoint {
            lid: 1,
            qpn: 2,
            psn: 3,
            gid: [0; 16],
        }
        .encode();
        assert!(VerbsEndpoint::decode(&good).is_ok());
        for cut in [0, 1, 25] {
            assert!(matches!(
                VerbsEndpoint::decode(&good[..cut]),
                Err(Error::MalformedHandshake(_))
            ));
        }
        let mut long = good.clone();
        long.push(0);
        assert!(VerbsEndpoint::decode(&long).is_err());
        let mut wide = good.clone();
        wide[5] = 1; // QPN high byte
        assert!(VerbsEndpoint::decode(&wide).is_err());
        let mut wide = good.clone();
        wide[9] = 1; // PSN high byte
        assert!(VerbsEndpoint::decode(&wide).is_err());
        let mut nowhere = good;
        nowhere[0] = 0; // LID 0 and GID 0
        assert!(VerbsEndpoint::decode(&nowhere).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn round_trips(lid in 1u16.., qpn in 0u32..=MAX_24, psn in 0u32..=MAX_24, gid in any::<[u8; 16]>()) {
            let e = VerbsEndpoint { lid, qpn, psn, gid };
            prop_assert_eq!(VerbsEndpoint::decode(&e.encode()).unwrap(), e);
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = VerbsEndpoint::decode(&b);
        }
    }
}
