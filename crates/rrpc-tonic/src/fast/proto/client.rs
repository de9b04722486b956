//! The client side of a fast-path connection: what each server frame
//! means, which ids new calls get, and when (and why) the connection ends.
//!
//! The call table itself (each call's queue of events, its task's waker,
//! its flow-control windows) and the leader/follower receive are still the
//! driver's (`fast::client`'s demultiplexer), under its lock: this state
//! lives inside that table, so it adds no lock.

use bytes::Bytes;
use tonic::Status;

use super::Event;
use crate::Error;
use crate::frame::{self, FrameError, Kind};

/// Why the connection ended (or stopped taking calls): a gRPC code and a
/// message, what every call still open and every new call gets.
pub(crate) type Reason = (tonic::Code, String);

/// Decodes one ring message: each call's events in order, whether the
/// server said GOAWAY, and the first protocol violation (nothing after it
/// is decoded). The one receive-side copy of response data happens here:
/// ring slot -> body chunk.
pub(crate) fn decode(
    msg: &[u8],
    events: &mut Vec<(u32, Event)>,
    goaway: &mut bool,
    bad: &mut Option<FrameError>,
) {
    for f in frame::frames(msg) {
        let f = match f {
            Ok(f) => f,
            Err(e) => {
                *bad = Some(e);
                return;
            }
        };
        let ev = match f.kind {
            Kind::ResponseHeaders => match frame::parse_response_headers(f.payload) {
                Ok((status, headers)) => Event::Headers {
                    status,
                    headers,
                    end: f.end_stream(),
                },
                Err(e) => {
                    *bad = Some(e);
                    return;
                }
            },
            Kind::Data => Event::Data(Bytes::copy_from_slice(f.payload)),
            Kind::Trailers => match frame::parse_metadata(f.payload) {
                Ok(m) => Event::Trailers(m),
                Err(e) => {
                    *bad = Some(e);
                    return;
                }
            },
            Kind::Cancel => Event::Reset(Status::cancelled("rrpc: call reset by the server")),
            Kind::WindowUpdate => match frame::parse_window_update(f.payload) {
                Ok(inc) => Event::Window(inc),
                Err(e) => {
                    *bad = Some(e);
                    return;
                }
            },
            Kind::GoAway => {
                *goaway = true;
                continue;
            }
            Kind::RequestHeaders => {
                *bad = Some(FrameError::Invalid("request headers sent to a client"));
                return;
            }
        };
        events.push((f.call_id, ev));
    }
}

/// The connection-level state of a client.
#[derive(Debug)]
pub(crate) struct Client {
    /// Set once the connection is gone or draining: new calls fail with it.
    closed: Option<Reason>,
    /// The next call id to try (0 is never a call's: the driver's
    /// fallback reader uses it).
    next_id: u32,
}

impl Default for Client {
    fn default() -> Self {
        Client {
            closed: None,
            next_id: 1,
        }
    }
}

impl Client {
    /// An id for a new call: the next one that is not 0 and not `in_use`.
    ///
    /// # Errors
    /// The connection closed or the server is draining: why.
    pub(crate) fn open(&mut self, in_use: impl Fn(u32) -> bool) -> Result<u32, Status> {
        if let Some((code, msg)) = &self.closed {
            return Err(Status::new(*code, msg.clone()));
        }
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            if id != 0 && !in_use(id) {
                return Ok(id);
            }
        }
    }

    /// The server said GOAWAY: new calls fail (`Unavailable`), calls in
    /// flight go on.
    pub(crate) fn handle_goaway(&mut self) {
        self.closed.get_or_insert((
            tonic::Code::Unavailable,
            "rrpc: server is shutting down".into(),
        ));
    }

    /// One receive ended with `r`, the first violation of its message (or
    /// of its delivery: a window broken) being `bad`: why the connection
    /// must close now, if it must.
    pub(crate) fn handle_receive(
        &self,
        r: Result<bool, &Error>,
        bad: Option<FrameError>,
    ) -> Option<Reason> {
        if let Some(e) = bad {
            return Some((
                tonic::Code::Internal,
                format!("rrpc: protocol violation by server: {e}"),
            ));
        }
        match r {
            Ok(true) => None,
            Ok(false) => Some((
                tonic::Code::Unavailable,
                "rrpc: connection closed by the server".to_string(),
            )),
            Err(e) => Some((e.code(), format!("rrpc: {e}"))),
        }
    }

    /// The connection ended: new calls fail with `reason`.
    pub(crate) fn close(&mut self, reason: Reason) {
        self.closed = Some(reason);
    }

    /// Why new calls fail, once they do.
    pub(crate) fn closed(&self) -> Option<&Reason> {
        self.closed.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::END_STREAM;

    fn decoded(
        frames: &[(Kind, u8, u32, Vec<u8>)],
    ) -> (Vec<(u32, Event)>, bool, Option<FrameError>) {
        let mut msg = Vec::new();
        for (k, f, id, p) in frames {
            frame::push_frame(&mut msg, *k, *f, *id, p);
        }
        let (mut ev, mut goaway, mut bad) = (Vec::new(), false, None);
        decode(&msg, &mut ev, &mut goaway, &mut bad);
        (ev, goaway, bad)
    }

    #[test]
    fn server_frames_become_call_events() {
        let headers =
            frame::response_headers_payload(http::StatusCode::OK, &http::HeaderMap::new());
        let (ev, goaway, bad) = decoded(&[
            (Kind::ResponseHeaders, 0, 1, headers),
            (Kind::Data, 0, 1, b"abc".to_vec()),
            (Kind::GoAway, 0, 0, Vec::new()),
            (
                Kind::WindowUpdate,
                0,
                3,
                frame::window_update_payload(9).to_vec(),
            ),
            (Kind::Cancel, 0, 3, Vec::new()),
            (
                Kind::Trailers,
                END_STREAM,
                1,
                frame::metadata_payload(&http::HeaderMap::new()),
            ),
        ]);
        assert!(goaway && bad.is_none());
        let kinds: Vec<_> = ev
            .iter()
            .map(|(id, e)| match e {
                Event::Headers { end: false, .. } => (*id, "headers"),
                Event::Data(b) if b.as_ref() == b"abc" => (*id, "data"),
                Event::Window(9) => (*id, "window"),
                Event::Reset(s) if s.code() == tonic::Code::Cancelled => (*id, "reset"),
                Event::Trailers(_) => (*id, "trailers"),
                e => panic!("{e:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (1, "headers"),
                (1, "data"),
                (3, "window"),
                (3, "reset"),
                (1, "trailers")
            ]
        );
    }

    #[test]
    fn a_client_frame_from_the_server_is_a_violation() {
        let open = frame::request_headers_payload("/x.Y/Z", "", &http::HeaderMap::new());
        let (ev, _, bad) = decoded(&[
            (Kind::Data, 0, 1, b"a".to_vec()),
            (Kind::RequestHeaders, 0, 2, open),
            (Kind::Data, 0, 1, b"b".to_vec()),
        ]);
        assert_eq!(ev.len(), 1, "nothing after the violation");
        let c = Client::default();
        let (code, msg) = c.handle_receive(Ok(true), bad).expect("closes");
        assert_eq!(code, tonic::Code::Internal);
        assert!(msg.contains("request headers sent to a client"), "{msg}");
    }

    #[test]
    fn ids_skip_zero_and_calls_in_flight_and_goaway_stops_new_calls() {
        let mut c = Client::default();
        assert_eq!(c.open(|id| id == 1 || id == 2).expect("open"), 3);
        assert_eq!(c.open(|_| false).expect("open"), 4);
        c.next_id = u32::MAX;
        assert_eq!(c.open(|_| false).expect("open"), u32::MAX);
        assert_eq!(c.open(|_| false).expect("open"), 1, "0 is never a call's");
        c.handle_goaway();
        let st = c.open(|_| false).expect_err("draining");
        assert_eq!(st.code(), tonic::Code::Unavailable);
        // Draining is not closing: a receive that went well ends nothing;
        // a server that left or a failed receive does.
        assert!(c.handle_receive(Ok(true), None).is_none());
        let (code, _) = c.handle_receive(Ok(false), None).expect("peer closed");
        assert_eq!(code, tonic::Code::Unavailable);
        let (code, _) = c
            .handle_receive(Err(&Error::Rings("x".into())), None)
            .expect("failed");
        assert_eq!(code, Error::Rings("x".into()).code());
    }
}
