//! Both ends of the protocol, wired by hand: every message goes through
//! the encoder and the decoder.

use super::*;

const SLOT: u32 = 4096;
const RING: u16 = 0x5242;

/// Decodes one whole frame.
fn msg(f: &[u8]) -> MuxMessage {
    let (m, used) = MuxMessage::decode(f).unwrap().expect("whole");
    assert_eq!(used, f.len());
    m
}

/// A client and a server, each having granted the other an arena of
/// `slots` slots.
fn pair(slots: u64, limits: MuxLimits) -> (Mux, Mux) {
    let mut c = Mux::new(MuxRole::Client, limits);
    let mut s = Mux::new(MuxRole::Server, limits);
    let (_, g) = c.grant(slots * u64::from(SLOT), SLOT).unwrap();
    assert!(matches!(
        s.handle(msg(&g)).unwrap(),
        MuxEvent::Granted { .. }
    ));
    let (_, g) = s.grant(slots * u64::from(SLOT), SLOT).unwrap();
    assert!(matches!(
        c.handle(msg(&g)).unwrap(),
        MuxEvent::Granted { .. }
    ));
    (c, s)
}

fn ring_parts(m: &mut Mux) -> Parts {
    Parts {
        sections: vec![(RING, b"params".to_vec())],
        slices: vec![(RING, m.take_slot(3000).expect("a free slot"))],
    }
}

/// Client opens `tag`; the server accepts: both open.
fn open(c: &mut Mux, s: &mut Mux, tag: u32) {
    let parts = ring_parts(c);
    let (req, f) = c.open(tag, parts.clone()).unwrap();
    let MuxEvent::OpenRequested {
        req: r,
        tag: t,
        parts: p,
        ahead: None,
    } = s.handle(msg(&f)).unwrap()
    else {
        panic!("an open request")
    };
    assert_eq!((r, t, &p), (req, tag, &parts));
    let answer = ring_parts(s);
    let f = s.accept(req, answer.clone()).unwrap();
    assert_eq!(
        c.handle(msg(&f)).unwrap(),
        MuxEvent::Opened {
            req,
            tag,
            parts: answer
        }
    );
}

#[test]
fn open_then_close_gives_every_slot_back_at_both_ends() {
    let (mut c, mut s) = pair(2, MuxLimits::default());
    open(&mut c, &mut s, 7);
    assert_eq!((c.free_slots(), s.free_slots()), (1, 1));
    assert_eq!(s.peer.in_use(), 1);
    let f = c.close(7).unwrap().expect("a close to send");
    let MuxEvent::PeerClosed { tag: 7, reply } = s.handle(msg(&f)).unwrap() else {
        panic!("peer closed")
    };
    // The server's slot is back once it has stopped writing (it answers).
    assert_eq!((s.free_slots(), s.peer.in_use()), (2, 0));
    assert!(c.is_taken(7), "the client's slot waits for the answer");
    assert_eq!(c.free_slots(), 1);
    assert_eq!(c.handle(msg(&reply)).unwrap(), MuxEvent::Closed { tag: 7 });
    assert_eq!((c.free_slots(), c.peer.in_use()), (2, 0));
    assert!(!c.is_taken(7) && !s.is_taken(7));
    // The tag and the slots serve again.
    open(&mut c, &mut s, 7);
}

#[test]
fn many_opens_in_flight_are_answered_in_any_order() {
    let (mut c, mut s) = pair(8, MuxLimits::default());
    let mut asked = Vec::new();
    for tag in 0..4 {
        let parts = ring_parts(&mut c);
        let (req, f) = c.open(tag, parts).unwrap();
        let MuxEvent::OpenRequested { req: r, .. } = s.handle(msg(&f)).unwrap() else {
            panic!()
        };
        assert_eq!(r, req);
        asked.push((req, tag));
    }
    for &(req, tag) in asked.iter().rev() {
        let f = if tag == 1 {
            s.refuse(req, "not this one").unwrap()
        } else {
            let p = ring_parts(&mut s);
            s.accept(req, p).unwrap()
        };
        match c.handle(msg(&f)).unwrap() {
            MuxEvent::Opened { req: r, tag: t, .. } => assert_eq!((r, t), (req, tag)),
            MuxEvent::Refused {
                req: r,
                tag: 1,
                reason,
            } => {
                assert_eq!(r, req);
                assert_eq!(reason, "not this one");
            }
            e => panic!("{e:?}"),
        }
    }
    // The refused one's slots are back at both ends.
    assert_eq!((c.free_slots(), s.free_slots()), (5, 5));
    let mut tags: Vec<_> = c.tags().collect();
    tags.sort();
    assert_eq!(tags, [0, 2, 3]);
    // An answer twice is the peer's fault.
    let f = s.refuse(asked[0].0, "again");
    assert!(f.is_err(), "answered already");
}

#[test]
fn a_connect_dropped_while_opening_closes_when_answered() {
    let (mut c, mut s) = pair(2, MuxLimits::default());
    let parts = ring_parts(&mut c);
    let (req, f) = c.open(3, parts).unwrap();
    c.abandon(req);
    let MuxEvent::OpenRequested { .. } = s.handle(msg(&f)).unwrap() else {
        panic!()
    };
    let p = ring_parts(&mut s);
    let f = s.accept(req, p).unwrap();
    let MuxEvent::Send(close) = c.handle(msg(&f)).unwrap() else {
        panic!("the client closes what it gave up on")
    };
    let MuxEvent::PeerClosed { reply, .. } = s.handle(msg(&close)).unwrap() else {
        panic!()
    };
    assert_eq!(c.handle(msg(&reply)).unwrap(), MuxEvent::Closed { tag: 3 });
    assert_eq!((c.free_slots(), s.free_slots()), (2, 2));
    assert_eq!((c.tags().count(), s.tags().count()), (0, 0));
}

#[test]
fn closes_that_cross_answer_each_other() {
    let (mut c, mut s) = pair(2, MuxLimits::default());
    open(&mut c, &mut s, 1);
    let (fc, fs) = (
        c.close(1).unwrap().expect("a close to send"),
        s.close(1).unwrap().expect("a close to send"),
    );
    assert_eq!(s.handle(msg(&fc)).unwrap(), MuxEvent::Closed { tag: 1 });
    assert_eq!(c.handle(msg(&fs)).unwrap(), MuxEvent::Closed { tag: 1 });
    assert_eq!((c.free_slots(), s.free_slots()), (2, 2));
    assert!(c.close(1).is_err(), "closed already");
}

#[test]
fn limits_are_refusals_and_hold_for_a_peer_that_never_closes() {
    let limits = MuxLimits {
        max_open: 3,
        max_pending: 2,
        ..MuxLimits::default()
    };
    let (mut c, mut s) = pair(16, limits);
    // Two pending at most: the third is refused, nothing set up.
    let mut reqs = Vec::new();
    for tag in 0..3 {
        let parts = ring_parts(&mut c);
        let (req, f) = c.open(tag, parts).unwrap();
        match s.handle(msg(&f)).unwrap() {
            MuxEvent::OpenRequested { .. } => reqs.push(req),
            MuxEvent::Send(r) => {
                assert_eq!(tag, 2);
                let MuxEvent::Refused { reason, .. } = c.handle(msg(&r)).unwrap() else {
                    panic!()
                };
                assert!(reason.contains("waiting already (at most 2)"), "{reason}");
            }
            e => panic!("{e:?}"),
        }
    }
    assert_eq!(s.peer.in_use(), 2, "the refused open claimed nothing");
    for req in reqs {
        let p = ring_parts(&mut s);
        let f = s.accept(req, p).unwrap();
        assert!(matches!(
            c.handle(msg(&f)).unwrap(),
            MuxEvent::Opened { .. }
        ));
    }
    // A client that opens and never closes: three open at most.
    open(&mut c, &mut s, 10);
    let parts = ring_parts(&mut c);
    let (_, f) = c.open(11, parts).unwrap();
    let MuxEvent::Send(r) = s.handle(msg(&f)).unwrap() else {
        panic!("refused")
    };
    let MuxEvent::Refused {
        reason, tag: 11, ..
    } = c.handle(msg(&r)).unwrap()
    else {
        panic!()
    };
    assert!(
        reason.contains("open already and 0 granted ahead (at most 3)"),
        "{reason}"
    );
    assert_eq!(s.tags().count(), 3);
}

/// Every hostile message is an error naming it, and changes nothing.
#[test]
fn a_hostile_peer_gets_an_error_and_changes_nothing() {
    let (mut c, mut s) = pair(4, MuxLimits::default());
    open(&mut c, &mut s, 1);
    let slot = |arena, offset| Slice {
        arena,
        offset,
        len: 100,
    };
    let open_msg = |req, tag, slices: Vec<Slice>| MuxMessage::Open {
        req,
        tag,
        parts: Parts {
            sections: vec![],
            slices: slices
                .into_iter()
                .enumerate()
                .map(|(i, s)| (i as u16, s))
                .collect(),
        },
    };
    let (free, in_use, tags) = (s.free_slots(), s.peer.in_use(), s.tags().count());
    for (m, says) in [
        (open_msg(50, 1, vec![]), "tag 1 is already in use"),
        (open_msg(51, 2, vec![slot(9, 0)]), "never granted"),
        (open_msg(52, 2, vec![slot(0, 100)]), "no slot"),
        // The slot the open connection uses (the client's first).
        (open_msg(53, 2, vec![slot(0, 0)]), "already in use"),
        // Two slices, the second bad: the first is not kept.
        (
            open_msg(54, 2, vec![slot(0, 4096), slot(0, 4096)]),
            "already in use",
        ),
        (
            MuxMessage::Opened {
                req: 0,
                parts: Parts::default(),
            },
            "sent to the server",
        ),
        (MuxMessage::Close { tag: 99 }, "not open"),
        (MuxMessage::Closed { tag: 1 }, "not closing"),
        (
            MuxMessage::Grant {
                arena: 0,
                slot: SLOT,
                len: 4096,
            },
            "granted twice",
        ),
    ] {
        let e = s.handle(m.clone()).unwrap_err();
        assert!(e.to_string().contains(says), "{m:?}: {e}");
        assert_eq!(
            (s.free_slots(), s.peer.in_use(), s.tags().count()),
            (free, in_use, tags),
            "{m:?} changed something"
        );
    }
    // And at the client.
    for (m, says) in [
        (open_msg(0, 5, vec![]), "sent to the client"),
        (
            MuxMessage::Opened {
                req: 77,
                parts: Parts::default(),
            },
            "not waiting",
        ),
        (
            MuxMessage::Refused {
                req: 77,
                reason: String::new(),
            },
            "not waiting",
        ),
    ] {
        let e = c.handle(m.clone()).unwrap_err();
        assert!(e.to_string().contains(says), "{m:?}: {e}");
    }
    // Too much arena memory.
    let mut small = Mux::new(
        MuxRole::Server,
        MuxLimits {
            max_arena_bytes: 8192,
            ..MuxLimits::default()
        },
    );
    let g = MuxMessage::Grant {
        arena: 0,
        slot: SLOT,
        len: 1 << 20,
    };
    assert!(matches!(small.handle(g), Err(Error::LimitExceeded { .. })));
    // The connection that was open is still open, and closes cleanly.
    let f = c.close(1).unwrap().expect("a close to send");
    let MuxEvent::PeerClosed { reply, .. } = s.handle(msg(&f)).unwrap() else {
        panic!()
    };
    assert_eq!(c.handle(msg(&reply)).unwrap(), MuxEvent::Closed { tag: 1 });
}

#[test]
fn local_mistakes_are_refused_before_anything_is_sent() {
    let (mut c, mut s) = pair(2, MuxLimits::default());
    assert!(
        s.open(1, Parts::default()).is_err(),
        "a server opens nothing"
    );
    let foreign = Parts {
        sections: vec![],
        slices: vec![(
            RING,
            Slice {
                arena: 40,
                offset: 0,
                len: 1,
            },
        )],
    };
    assert!(c.open(1, foreign).is_err());
    open(&mut c, &mut s, 1);
    assert!(c.open(1, Parts::default()).is_err(), "tag in use");
    assert!(s.accept(1234, Parts::default()).is_err());
    // A slot taken for a connect that never sent its open goes back.
    let before = c.free_slots();
    let t = c.take_slot(10).unwrap();
    c.untake(&[t]);
    assert_eq!(c.free_slots(), before);
    assert!(c.take_slot(u64::from(SLOT) + 1).is_none());
}

/// The server grants `n` slots ahead; the client has them.
fn credit(c: &mut Mux, s: &mut Mux, n: u16) -> Vec<Slice> {
    let slices: Vec<(u16, Slice)> = (0..n)
        .map(|i| (i, s.take_slot(3000).expect("a free slot")))
        .collect();
    let f = s
        .credit(Parts {
            sections: vec![(RING, b"answer".to_vec())],
            slices: slices.clone(),
        })
        .unwrap();
    assert_eq!(c.handle(msg(&f)).unwrap(), MuxEvent::Ahead);
    slices.into_iter().map(|(_, sl)| sl).collect()
}

#[test]
fn an_open_ahead_is_open_at_once_and_confirmed() {
    let (mut c, mut s) = pair(4, MuxLimits::default());
    let granted = credit(&mut c, &mut s, 2);
    assert_eq!((c.ahead_left(), s.credited()), (2, 2));
    assert_eq!(c.ahead_sections(), &[(RING, b"answer".to_vec())]);
    let parts = ring_parts(&mut c);
    let (req, f, theirs) = c.open_ahead(4, parts.clone(), RING).unwrap().unwrap();
    assert_eq!(theirs.sections, vec![(RING, b"answer".to_vec())]);
    let slot = theirs.slice(RING).unwrap();
    assert!(granted.contains(&slot));
    assert_eq!(
        s.handle(msg(&f)).unwrap(),
        MuxEvent::OpenRequested {
            req,
            tag: 4,
            parts,
            ahead: Some(slot)
        }
    );
    assert_eq!(s.slots_of(4), vec![slot]);
    // Its answer offers no slice: the slot is the one granted ahead.
    let offered = ring_parts(&mut s);
    assert!(s.accept(req, offered.clone()).is_err());
    s.untake(&[offered.slices[0].1]);
    let f = s.accept(req, Parts::default()).unwrap();
    assert_eq!(
        c.handle(msg(&f)).unwrap(),
        MuxEvent::OpenedAhead { req, tag: 4 }
    );
    // Closed as any other: every slot back, the other slot still ahead.
    let f = c.close(4).unwrap().expect("a close");
    let MuxEvent::PeerClosed { reply, .. } = s.handle(msg(&f)).unwrap() else {
        panic!()
    };
    assert_eq!(c.handle(msg(&reply)).unwrap(), MuxEvent::Closed { tag: 4 });
    assert_eq!((c.free_slots(), s.free_slots()), (4, 3));
    assert_eq!((c.peer.in_use(), s.peer.in_use()), (1, 0));
    assert_eq!((c.ahead_left(), s.credited()), (1, 1));
}

#[test]
fn an_open_ahead_dropped_before_its_answer_closes_when_confirmed() {
    let (mut c, mut s) = pair(4, MuxLimits::default());
    credit(&mut c, &mut s, 1);
    let parts = ring_parts(&mut c);
    let (req, f, _) = c.open_ahead(2, parts, RING).unwrap().unwrap();
    assert_eq!(
        c.close(2).unwrap(),
        None,
        "nothing to send before the answer"
    );
    let MuxEvent::OpenRequested { .. } = s.handle(msg(&f)).unwrap() else {
        panic!()
    };
    let f = s.accept(req, Parts::default()).unwrap();
    let MuxEvent::Send(close) = c.handle(msg(&f)).unwrap() else {
        panic!("closed when confirmed")
    };
    let MuxEvent::PeerClosed { reply, .. } = s.handle(msg(&close)).unwrap() else {
        panic!()
    };
    assert_eq!(c.handle(msg(&reply)).unwrap(), MuxEvent::Closed { tag: 2 });
    assert_eq!((c.free_slots(), s.free_slots()), (4, 4));
    assert_eq!((c.tags().count(), s.tags().count()), (0, 0));
}

#[test]
fn an_open_ahead_refused_is_closed_and_its_slots_come_back() {
    let (mut c, mut s) = pair(4, MuxLimits::default());
    credit(&mut c, &mut s, 1);
    let parts = ring_parts(&mut c);
    let (req, f, _) = c.open_ahead(2, parts, RING).unwrap().unwrap();
    let MuxEvent::OpenRequested { .. } = s.handle(msg(&f)).unwrap() else {
        panic!()
    };
    // The client wrote already: the refusal closes the lane, and the
    // server's slot waits for the client's answer.
    let f = s.refuse(req, "no room").unwrap();
    assert!(s.is_taken(2));
    let MuxEvent::RefusedAhead {
        tag: 2,
        reason,
        reply,
        ..
    } = c.handle(msg(&f)).unwrap()
    else {
        panic!("the client's lane refused")
    };
    assert_eq!(reason, "no room");
    assert_eq!(s.handle(msg(&reply)).unwrap(), MuxEvent::Closed { tag: 2 });
    assert_eq!((c.free_slots(), s.free_slots()), (4, 4));
    assert_eq!((c.peer.in_use(), s.peer.in_use()), (0, 0));
    assert_eq!((c.ahead_left(), s.credited()), (0, 0));
    // Without a slot in hand there is no open ahead.
    let parts = ring_parts(&mut c);
    assert!(c.open_ahead(3, parts, RING).unwrap().is_none());
}

#[test]
fn grants_ahead_are_bounded_and_a_hostile_peer_gets_an_error() {
    let limits = MuxLimits {
        max_open: 3,
        ..MuxLimits::default()
    };
    let (mut c, mut s) = pair(8, limits);
    // Past the open limit with what is open: refused locally.
    open(&mut c, &mut s, 1);
    let three: Vec<(u16, Slice)> = (0..3).map(|i| (i, s.take_slot(3000).unwrap())).collect();
    assert!(
        s.credit(Parts {
            sections: vec![],
            slices: three
        })
        .is_err()
    );
    assert!(
        c.credit(Parts::default()).is_err(),
        "a client grants nothing ahead"
    );
    let granted = credit(&mut c, &mut s, 1);
    // With one open and one granted ahead, one more plain open fits, then
    // none: the open ahead keeps its place.
    open(&mut c, &mut s, 2);
    let p = ring_parts(&mut c);
    let (_, f) = c.open(3, p).unwrap();
    let MuxEvent::Send(refused) = s.handle(msg(&f)).unwrap() else {
        panic!("refused: a place is granted ahead")
    };
    let MuxEvent::Refused { reason, .. } = c.handle(msg(&refused)).unwrap() else {
        panic!()
    };
    assert!(reason.contains("1 granted ahead"), "{reason}");
    // An open ahead into a slot not granted ahead.
    let parts = ring_parts(&mut c);
    let bad_slot = Slice {
        offset: granted[0].offset + u64::from(SLOT),
        ..granted[0]
    };
    let f = MuxMessage::OpenAhead {
        req: 90,
        tag: 9,
        parts: parts.clone(),
        slot: bad_slot,
    }
    .encode()
    .unwrap();
    let e = s.handle(msg(&f)).unwrap_err();
    assert!(e.to_string().contains("no slot granted ahead"), "{e}");
    // Grants ahead sent to the server, or past the bound, to the client.
    let f = MuxMessage::Ahead {
        parts: Parts::default(),
    }
    .encode()
    .unwrap();
    assert!(s.handle(msg(&f)).is_err());
    let many = Parts {
        sections: vec![],
        slices: (0..=MAX_AHEAD as u16)
            .map(|i| {
                (
                    i,
                    Slice {
                        arena: 0,
                        offset: u64::from(i) * u64::from(SLOT),
                        len: 3000,
                    },
                )
            })
            .collect(),
    };
    assert!(
        MuxMessage::Ahead { parts: many }.encode().is_err(),
        "bounded on the wire"
    );
    // A close of an open ahead not answered yet, or an answer naming
    // slices, is the server's fault.
    let (req, f, _) = c.open_ahead(4, parts, RING).unwrap().unwrap();
    let MuxEvent::OpenRequested { .. } = s.handle(msg(&f)).unwrap() else {
        panic!()
    };
    let close = MuxMessage::Close { tag: 4 }.encode().unwrap();
    assert!(c.handle(msg(&close)).is_err());
    let with_slices = MuxMessage::Opened {
        req,
        parts: ring_parts(&mut c2_slots()),
    }
    .encode()
    .unwrap();
    assert!(c.handle(msg(&with_slices)).is_err());
}

/// A mux with a granted arena of its own, to take slices from.
fn c2_slots() -> Mux {
    let mut m = Mux::new(MuxRole::Server, MuxLimits::default());
    let _ = m.grant(4 * u64::from(SLOT), SLOT).unwrap();
    m
}

/// One step of [`both_ends_in_any_interleaving_give_every_slot_back`].
#[derive(Debug, Clone)]
enum Step {
    Open,
    OpenAhead,
    Credit,
    Answer { pick: usize, accept: bool },
    ClientClose { pick: usize },
    Abandon { pick: usize },
    ServerClose { pick: usize },
    ToServer,
    ToClient,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        Just(Step::Open),
        Just(Step::OpenAhead),
        Just(Step::Credit),
        (any::<usize>(), any::<bool>()).prop_map(|(pick, accept)| Step::Answer { pick, accept }),
        any::<usize>().prop_map(|pick| Step::ClientClose { pick }),
        any::<usize>().prop_map(|pick| Step::Abandon { pick }),
        any::<usize>().prop_map(|pick| Step::ServerClose { pick }),
        Just(Step::ToServer),
        Just(Step::ToServer),
        Just(Step::ToClient),
        Just(Step::ToClient),
    ]
}

/// Both ends of one shared connection with the messages in flight each
/// way (in order, as the side channel keeps them).
struct Wire {
    c: Mux,
    s: Mux,
    to_s: std::collections::VecDeque<Vec<u8>>,
    to_c: std::collections::VecDeque<Vec<u8>>,
    next_tag: u32,
}

impl Wire {
    fn pick<T: Copy>(v: &[T], i: usize) -> Option<T> {
        (!v.is_empty()).then(|| v[i % v.len()])
    }

    fn tags_where(m: &Mux, f: impl Fn(&State) -> bool) -> Vec<u32> {
        let mut t: Vec<u32> = m
            .conns
            .iter()
            .filter(|(_, e)| f(&e.state))
            .map(|(t, _)| *t)
            .collect();
        t.sort_unstable();
        t
    }

    fn run(&mut self, st: &Step) {
        match *st {
            Step::Open | Step::OpenAhead => {
                let Some(sl) = self.c.take_slot(3000) else {
                    return;
                };
                let parts = Parts {
                    sections: vec![],
                    slices: vec![(RING, sl)],
                };
                let tag = self.next_tag;
                self.next_tag += 1;
                let f = if matches!(st, Step::Open) {
                    Some(self.c.open(tag, parts).unwrap().1)
                } else {
                    self.c.open_ahead(tag, parts, RING).unwrap().map(|o| o.1)
                };
                match f {
                    Some(f) => self.to_s.push_back(f),
                    None => self.c.untake(&[sl]),
                }
            }
            Step::Credit => {
                let Some(sl) = self.s.take_slot(3000) else {
                    return;
                };
                let p = Parts {
                    sections: vec![(RING, b"answer".to_vec())],
                    slices: vec![(0, sl)],
                };
                match self.s.credit(p) {
                    Ok(f) => self.to_c.push_back(f),
                    Err(_) => self.s.untake(&[sl]),
                }
            }
            Step::Answer { pick, accept } => {
                let mut asked: Vec<(u32, bool)> = self
                    .s
                    .conns
                    .values()
                    .filter_map(|e| match e.state {
                        State::Asked { req, ahead } => Some((req, ahead)),
                        _ => None,
                    })
                    .collect();
                asked.sort_unstable();
                let Some((req, ahead)) = Self::pick(&asked, pick) else {
                    return;
                };
                let f = if !accept {
                    self.s.refuse(req, "no").unwrap()
                } else if ahead {
                    self.s.accept(req, Parts::default()).unwrap()
                } else if let Some(sl) = self.s.take_slot(3000) {
                    let p = Parts {
                        sections: vec![],
                        slices: vec![(RING, sl)],
                    };
                    self.s.accept(req, p).unwrap()
                } else {
                    self.s.refuse(req, "full").unwrap()
                };
                self.to_c.push_back(f);
            }
            Step::ClientClose { pick } => {
                let open = Self::tags_where(&self.c, |s| {
                    matches!(s, State::Open | State::Opening { ahead: true, .. })
                });
                if let Some(tag) = Self::pick(&open, pick)
                    && let Some(f) = self.c.close(tag).unwrap()
                {
                    self.to_s.push_back(f);
                }
            }
            Step::Abandon { pick } => {
                let mut opening: Vec<u32> = self
                    .c
                    .conns
                    .values()
                    .filter_map(|e| match e.state {
                        State::Opening {
                            req, ahead: false, ..
                        } => Some(req),
                        _ => None,
                    })
                    .collect();
                opening.sort_unstable();
                if let Some(req) = Self::pick(&opening, pick) {
                    self.c.abandon(req);
                }
            }
            Step::ServerClose { pick } => {
                let open = Self::tags_where(&self.s, |s| *s == State::Open);
                if let Some(tag) = Self::pick(&open, pick) {
                    let f = self.s.close(tag).unwrap().expect("a close");
                    self.to_c.push_back(f);
                }
            }
            Step::ToServer => {
                let Some(f) = self.to_s.pop_front() else {
                    return;
                };
                match self
                    .s
                    .handle(msg(&f))
                    .expect("the client keeps the protocol")
                {
                    MuxEvent::Send(f) | MuxEvent::PeerClosed { reply: f, .. } => {
                        self.to_c.push_back(f)
                    }
                    MuxEvent::OpenRequested { .. } | MuxEvent::Closed { .. } => {}
                    e => panic!("a server got {e:?}"),
                }
            }
            Step::ToClient => {
                let Some(f) = self.to_c.pop_front() else {
                    return;
                };
                match self
                    .c
                    .handle(msg(&f))
                    .expect("the server keeps the protocol")
                {
                    MuxEvent::Send(f)
                    | MuxEvent::PeerClosed { reply: f, .. }
                    | MuxEvent::RefusedAhead { reply: f, .. } => self.to_s.push_back(f),
                    MuxEvent::Opened { .. }
                    | MuxEvent::OpenedAhead { .. }
                    | MuxEvent::Refused { .. }
                    | MuxEvent::Closed { .. }
                    | MuxEvent::Ahead => {}
                    e => panic!("a client got {e:?}"),
                }
            }
        }
        self.check();
    }

    /// No slot is in two places at once at either end: an entry's, a
    /// grant ahead's, a free list's.
    fn check(&self) {
        for m in [&self.c, &self.s] {
            let mut ours: Vec<Slice> = m.conns.values().flat_map(|e| e.ours.clone()).collect();
            ours.extend(m.credited.iter().copied());
            let n = ours.len();
            ours.sort_unstable_by_key(|s| (s.arena, s.offset));
            ours.dedup_by_key(|s| (s.arena, s.offset));
            assert_eq!(ours.len(), n, "a slot of ours used twice");
            assert_eq!(m.free_slots() + n, 8, "every slot of ours somewhere");
            let theirs: usize =
                m.conns.values().map(|e| e.theirs.len()).sum::<usize>() + m.ahead.len();
            assert_eq!(m.peer.in_use(), theirs, "the peer's slots we hold");
        }
    }

    /// Refuses what is asked, closes what is open, and delivers, until
    /// nothing is left.
    fn drain(&mut self) {
        for _ in 0..16 {
            for pick in 0..8 {
                self.run(&Step::Answer {
                    pick,
                    accept: false,
                });
                self.run(&Step::ClientClose { pick });
            }
            while !self.to_s.is_empty() || !self.to_c.is_empty() {
                self.run(&Step::ToServer);
                self.run(&Step::ToClient);
            }
            if self.c.conns.is_empty() && self.s.conns.is_empty() {
                return;
            }
        }
        panic!("never quiet: {:?} {:?}", self.c.conns, self.s.conns);
    }
}

proptest::proptest! {
    /// Opens, opens ahead, grants ahead, answers, refusals, closes from
    /// either end and abandoned connects, in any interleaving of both ends
    /// (each direction in order): no end ever gets a protocol error from
    /// an honest peer, no slot is in two places at once, and once every
    /// connection is refused or closed and every message delivered, each
    /// end has all its slots back but those granted ahead, which the
    /// client holds.
    #[test]
    fn both_ends_in_any_interleaving_give_every_slot_back(
        steps in proptest::collection::vec(step(), 0..120)
    ) {
        let (c, s) = pair(8, MuxLimits { max_open: 6, ..MuxLimits::default() });
        let mut w = Wire { c, s, to_s: Default::default(), to_c: Default::default(), next_tag: 0 };
        for st in &steps {
            w.run(st);
        }
        w.drain();
        proptest::prop_assert_eq!(w.c.free_slots(), 8);
        proptest::prop_assert_eq!(w.s.free_slots() + w.s.credited(), 8);
        proptest::prop_assert_eq!(w.c.ahead_left(), w.s.credited());
        proptest::prop_assert_eq!(w.c.peer.in_use(), w.c.ahead_left());
        proptest::prop_assert_eq!(w.s.peer.in_use(), 0);
    }
}
