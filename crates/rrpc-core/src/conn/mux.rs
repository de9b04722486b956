//! Logical connections over a shared connection's open side channel,
//! with their rings in arenas granted ahead (#58): the protocol, sans IO.
//!
//! Over a [`SharedConnection`](super::SharedConnection) each logical
//! connection used to run a handshake of its own on a new socket, passing
//! and mapping its rings' memory. Here it is one message on the side
//! channel the shared connection already has, answered on it:
//!
//! * **Arenas granted ahead.** When the shared connection opens (and
//!   whenever one end runs out: a whole arena more), each end grants the
//!   other an arena ([`MuxMessage::Grant`], its memory passed along once),
//!   cut into slots ([`Arena`]). A logical connection's rings are slots:
//!   its open names them ([`Slice`]), passes no descriptor and maps
//!   nothing. The peer checks each slice it is named against the arenas
//!   it was granted ([`PeerArenas::claim`]): a whole slot, not in use.
//! * **Open.** The client sends [`MuxMessage::Open`] with a request id
//!   and the sharer tag it picked; the server answers
//!   [`MuxMessage::Opened`] or [`MuxMessage::Refused`] with that id. Many
//!   may be in flight; a client that gave up on one ([`Mux::abandon`])
//!   closes the connection when its answer comes.
//! * **Close.** The end that drops a logical connection stops writing
//!   into its rings and sends [`MuxMessage::Close`]; the other stops
//!   too, takes its slots back and answers [`MuxMessage::Closed`]; the
//!   first takes its slots back on that answer. No slot is reused while
//!   the peer may still write into it: the retired-grant rule of the
//!   `logical` module ("Retired grants") with an explicit handshake in
//!   place of a lease. Closes that cross are both answers.
//! * **Open ahead (0-RTT).** Once the server has answered one open, it
//!   may grant the client slots of its arena ahead ([`MuxMessage::Ahead`],
//!   at most [`MAX_AHEAD`] outstanding), with the answer an open will get
//!   (its sections). The client then opens with
//!   [`MuxMessage::OpenAhead`], naming one of them, and writes at once:
//!   the server's slot was free and reset when granted, and nobody else
//!   writes it. The server's [`MuxMessage::Opened`] only confirms. A
//!   server that will not serve it answers [`MuxMessage::Refused`] as
//!   for any open, but the client has written already: the refusal
//!   closes the connection, and the server's slot comes back only with
//!   the client's [`MuxMessage::Closed`] (as a TCP server resets a
//!   connection its kernel accepted). Grants ahead count against
//!   [`MuxLimits::max_open`], so an open ahead is never past the limits.
//! * **Liveness.** The side channel's closing fails every logical
//!   connection over it (the driver's business: this machine only says
//!   which are open, [`Mux::tags`]).
//!
//! What a peer does wrong is an error from [`Mux::handle`]: the driver
//! closes that peer's shared connection (and with it only that peer's
//! logical connections). Limits ([`MuxLimits`]) are refusals, not errors:
//! an open past them is answered [`MuxMessage::Refused`] naming the limit,
//! so a peer that opens and never closes is held to them.

mod arena;
mod wire;

use std::collections::HashMap;

pub use arena::{Arena, MAX_ARENAS, PeerArenas};
/// Slots a server grants ahead at most at once ([`MuxMessage::Ahead`]).
pub const MAX_AHEAD: usize = MUX_MAX_PARTS;

pub use wire::{
    MUX_HEADER_LEN, MUX_MAGIC, MUX_MAX_BODY, MUX_MAX_BYTES, MUX_MAX_PARTS, MuxMessage, Parts, Slice,
};

use crate::error::{Error, Result};

/// Which end of the shared connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MuxRole {
    /// The end that opened the shared connection: it opens logical ones.
    Client,
    /// The end that accepted it: it answers opens.
    Server,
}

/// What one shared connection may hold: refusals past these, never errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MuxLimits {
    /// Logical connections open (or closing) at once.
    pub max_open: usize,
    /// Opens the server has not answered yet.
    pub max_pending: usize,
    /// Arena bytes the peer may grant us, in all.
    pub max_arena_bytes: u64,
}

impl Default for MuxLimits {
    /// 1024 open, 64 pending, 1 GiB of arenas: rrpc-core's
    /// `HandshakeConfig::max_grant_bytes` order of magnitude, the
    /// listener's pending-handshake bound.
    fn default() -> Self {
        MuxLimits {
            max_open: 1024,
            max_pending: 64,
            max_arena_bytes: 1 << 30,
        }
    }
}

/// What [`Mux::handle`] asks the driver to do.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub enum MuxEvent {
    /// Nothing.
    Nothing,
    /// Send these bytes (a refusal, or the close of an open given up on).
    Send(Vec<u8>),
    /// The peer granted arena `arena`: map the memory that came with it.
    Granted {
        /// The arena.
        arena: u16,
        /// Its length.
        len: u64,
    },
    /// Server: the client asks for logical connection `tag`; answer with
    /// [`Mux::accept`] or [`Mux::refuse`].
    OpenRequested {
        /// The request, to answer.
        req: u32,
        /// The sharer tag the client picked.
        tag: u32,
        /// What it offers (its slices checked).
        parts: Parts,
        /// An open ahead: our slot it writes into (granted ahead, reset
        /// then; the client may have written into it already), to be
        /// answered with [`Mux::accept`] offering no slice.
        ahead: Option<Slice>,
    },
    /// Client: an open ahead was confirmed (its connection was made when
    /// it was sent).
    OpenedAhead {
        /// The request.
        req: u32,
        /// Its tag.
        tag: u32,
    },
    /// Client: the server granted slots ahead; [`Mux::ahead_left`] says
    /// how many are in hand now.
    Ahead,
    /// Client: the server refused an open ahead, whose connection exists:
    /// fail it (it writes no more), then send `reply`.
    RefusedAhead {
        /// The request.
        req: u32,
        /// The logical connection, closed.
        tag: u32,
        /// The server's reason.
        reason: String,
        /// The [`MuxMessage::Closed`] to send once we write no more.
        reply: Vec<u8>,
    },
    /// Client: request `req` for `tag` was accepted: the connection is open.
    Opened {
        /// The request.
        req: u32,
        /// Its tag.
        tag: u32,
        /// What the server offers (its slices checked).
        parts: Parts,
    },
    /// Client: request `req` was refused; its slots are back.
    Refused {
        /// The request.
        req: u32,
        /// Its tag, free again.
        tag: u32,
        /// The server's reason.
        reason: String,
    },
    /// The peer closed `tag`: stop writing into its rings, then send
    /// `reply` (our slots are back, and the tag is free).
    PeerClosed {
        /// The logical connection.
        tag: u32,
        /// The [`MuxMessage::Closed`] to send once we write no more.
        reply: Vec<u8>,
    },
    /// A close we started is done: the peer writes into `tag`'s rings no
    /// more; our slots are back, and the tag is free.
    Closed {
        /// The logical connection.
        tag: u32,
    },
}

/// Where a logical connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Client: opened, not answered yet.
    Opening {
        req: u32,
        /// The connect gave up: close it when the answer comes.
        abandoned: bool,
        /// Opened ahead: its connection exists already.
        ahead: bool,
    },
    /// Server: asked for, not answered yet.
    Asked {
        req: u32,
        /// Opened ahead, into a slot of ours granted ahead.
        ahead: bool,
    },
    Open,
    /// We sent a close, and wait for its answer.
    Closing,
}

#[derive(Debug)]
struct Entry {
    state: State,
    /// Our slots it uses (in our arenas, the peer writes them).
    ours: Vec<Slice>,
    /// The peer's slots it uses (we write them).
    theirs: Vec<Slice>,
}

/// One end of the protocol over one shared connection (module docs).
#[derive(Debug)]
pub struct Mux {
    role: MuxRole,
    limits: MuxLimits,
    next_req: u32,
    next_arena: u16,
    /// Our arenas, granted to the peer.
    arenas: Vec<Arena>,
    /// The peer's arenas, granted to us.
    peer: PeerArenas,
    /// By tag.
    conns: HashMap<u32, Entry>,
    /// Open requests in flight: request id to tag.
    reqs: HashMap<u32, u32>,
    /// Our slots given back since [`Self::take_released`] (the driver
    /// gives their pages back to the system).
    released: Vec<Slice>,
    /// Server: our slots granted ahead, not opened yet.
    credited: Vec<Slice>,
    /// Client: the server's slots granted ahead, claimed in its arenas.
    ahead: Vec<Slice>,
    /// Client: the answer an open ahead gets (the last grant's sections).
    ahead_sections: Vec<(u16, Vec<u8>)>,
    /// Opens ahead sent (client) or received (server), in all.
    opened_ahead: u64,
}

impl Mux {
    /// A new end, nothing granted yet.
    pub fn new(role: MuxRole, limits: MuxLimits) -> Mux {
        Mux {
            role,
            limits,
            next_req: 0,
            next_arena: 0,
            arenas: Vec::new(),
            peer: PeerArenas::default(),
            conns: HashMap::new(),
            reqs: HashMap::new(),
            released: Vec::new(),
            credited: Vec::new(),
            ahead: Vec::new(),
            ahead_sections: Vec::new(),
            opened_ahead: 0,
        }
    }

    /// Grants the peer an arena of ours of `len` bytes in slots of `slot`:
    /// its id, and the message to send (its memory along with it).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] as [`Arena::new`], or past
    /// [`MAX_ARENAS`].
    pub fn grant(&mut self, len: u64, slot: u32) -> Result<(u16, Vec<u8>)> {
        if self.arenas.len() >= MAX_ARENAS {
            return Err(Error::InvalidConfig(format!(
                "{MAX_ARENAS} arenas granted already"
            )));
        }
        let id = self.next_arena;
        let arena = Arena::new(id, len, slot)?;
        let m = MuxMessage::Grant {
            arena: id,
            slot,
            len,
        }
        .encode()?;
        self.next_arena += 1;
        self.arenas.push(arena);
        Ok((id, m))
    }

    /// A free slot of our arenas for one ring of `len` bytes; `None` when
    /// every arena is full (grant another) or `len` exceeds their slots.
    pub fn take_slot(&mut self, len: u64) -> Option<Slice> {
        self.arenas.iter_mut().find_map(|a| a.take(len))
    }

    /// Gives back slots taken with [`Self::take_slot`] that no message
    /// named (a connect that failed before sending its open).
    pub fn untake(&mut self, slots: &[Slice]) {
        for s in slots {
            self.give_back(*s);
        }
    }

    fn give_back(&mut self, s: Slice) {
        if let Some(a) = self.arenas.iter_mut().find(|a| a.id() == s.arena) {
            a.give_back(s);
            self.released.push(s);
        }
    }

    /// Our slots given back (free again: nobody writes them) since the
    /// last call, for the driver to release their memory.
    pub fn take_released(&mut self) -> Vec<Slice> {
        std::mem::take(&mut self.released)
    }

    /// Our free slots, over every arena.
    pub fn free_slots(&self) -> usize {
        self.arenas.iter().map(Arena::free).sum()
    }

    /// Logical connections open, opening or closing, by tag.
    pub fn tags(&self) -> impl Iterator<Item = u32> + '_ {
        self.conns.keys().copied()
    }

    /// Our slots logical connection `tag` uses (none if it is not here).
    pub fn slots_of(&self, tag: u32) -> Vec<Slice> {
        self.conns
            .get(&tag)
            .map_or_else(Vec::new, |e| e.ours.clone())
    }

    /// Whether `tag` is in use at this end (no new connection may take it).
    pub fn is_taken(&self, tag: u32) -> bool {
        self.conns.contains_key(&tag)
    }

    /// Client: opens logical connection `tag` offering `parts` (its slices
    /// taken with [`Self::take_slot`]): the request id, and the message.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] on a server, for a tag in use, for a slice
    /// of no arena of ours, or as [`MuxMessage::encode`]; nothing changes.
    pub fn open(&mut self, tag: u32, parts: Parts) -> Result<(u32, Vec<u8>)> {
        self.may_open(tag)?;
        let ours = self.own_slices(&parts)?;
        let req = self.next_req;
        let m = MuxMessage::Open { req, tag, parts }.encode()?;
        self.opening_entry(tag, req, ours, Vec::new(), false);
        Ok((req, m))
    }

    /// Server: whether the peer may ask for request `req` under `tag`.
    fn may_be_asked(&self, req: u32, tag: u32) -> Result<()> {
        let bad = |what: String| Err(Error::MalformedHandshake(format!("side channel: {what}")));
        if self.role != MuxRole::Server {
            return bad(format!("an open (request {req}) sent to the client"));
        }
        if self.reqs.contains_key(&req) {
            return bad(format!("request {req} twice"));
        }
        if self.conns.contains_key(&tag) {
            return bad(format!("tag {tag} is already in use"));
        }
        Ok(())
    }

    /// Client: whether `tag` may be opened here.
    fn may_open(&self, tag: u32) -> Result<()> {
        if self.role != MuxRole::Client {
            return Err(Error::InvalidConfig(
                "a server opens no logical connection".into(),
            ));
        }
        if self.conns.contains_key(&tag) {
            return Err(Error::InvalidConfig(format!("tag {tag} is in use")));
        }
        Ok(())
    }

    /// Client: records open request `req` for `tag` (its message built).
    fn opening_entry(
        &mut self,
        tag: u32,
        req: u32,
        ours: Vec<Slice>,
        theirs: Vec<Slice>,
        ahead: bool,
    ) {
        self.next_req = self.next_req.wrapping_add(1);
        self.reqs.insert(req, tag);
        self.conns.insert(
            tag,
            Entry {
                state: State::Opening {
                    req,
                    abandoned: false,
                    ahead,
                },
                ours,
                theirs,
            },
        );
    }

    fn own_slices(&self, parts: &Parts) -> Result<Vec<Slice>> {
        parts
            .slices
            .iter()
            .map(|(_, s)| {
                if self.arenas.iter().any(|a| a.id() == s.arena) {
                    Ok(*s)
                } else {
                    Err(Error::InvalidConfig(format!(
                        "slice of arena {}, not ours",
                        s.arena
                    )))
                }
            })
            .collect()
    }

    /// Client: the connect of request `req` gave up (its future was
    /// dropped). Its connection is closed when the answer comes.
    pub fn abandon(&mut self, req: u32) {
        if let Some(tag) = self.reqs.get(&req)
            && let Some(e) = self.conns.get_mut(tag)
            && let State::Opening { abandoned, .. } = &mut e.state
        {
            *abandoned = true;
        }
    }

    /// Server: accepts request `req` offering `parts` (slices taken with
    /// [`Self::take_slot`]): the message to send. Set the connection up
    /// before sending it: the client writes as soon as it arrives.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a request not asked (or answered
    /// already), or as [`Self::open`].
    ///
    /// An open ahead ([`MuxEvent::OpenRequested`] with `ahead`) is answered
    /// offering no slice: its slot of ours is the one granted ahead.
    pub fn accept(&mut self, req: u32, parts: Parts) -> Result<Vec<u8>> {
        let (tag, ahead) = self.asked(req)?;
        if ahead && !parts.slices.is_empty() {
            return Err(Error::InvalidConfig(format!(
                "request {req} was opened ahead: its answer offers no slice"
            )));
        }
        let ours = self.own_slices(&parts)?;
        let m = MuxMessage::Opened { req, parts }.encode()?;
        self.reqs.remove(&req);
        let e = self.conns.get_mut(&tag).expect("asked");
        e.state = State::Open;
        if !ahead {
            e.ours = ours;
        }
        Ok(m)
    }

    /// Server: refuses request `req` (nothing set up), saying why.
    ///
    /// An open ahead's client has written already: its refusal closes it,
    /// and its slots come back with the client's answer
    /// ([`MuxEvent::Closed`]).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a request not asked (or answered
    /// already).
    pub fn refuse(&mut self, req: u32, reason: &str) -> Result<Vec<u8>> {
        let (tag, ahead) = self.asked(req)?;
        self.reqs.remove(&req);
        if ahead {
            let m = refusal(req, reason)?;
            self.conns.get_mut(&tag).expect("asked").state = State::Closing;
            return Ok(m);
        }
        let e = self.conns.remove(&tag).expect("asked");
        for s in e.theirs {
            self.peer.release(s);
        }
        refusal(req, reason)
    }

    fn asked(&self, req: u32) -> Result<(u32, bool)> {
        match self.reqs.get(&req) {
            Some(tag) => match self.conns[tag].state {
                State::Asked { ahead, .. } => Ok((*tag, ahead)),
                _ => Err(Error::InvalidConfig(format!(
                    "request {req} is not waiting for an answer"
                ))),
            },
            _ => Err(Error::InvalidConfig(format!(
                "request {req} is not waiting for an answer"
            ))),
        }
    }

    /// Server: grants the client slots of ours ahead (taken with
    /// [`Self::take_slot`], each under a role of its own in
    /// `parts.slices`), with the answer an open ahead gets
    /// (`parts.sections`): the message to send. Reset each slot's records
    /// before sending it: the client writes into it without waiting.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] on a client, for a slice of no arena of
    /// ours, past [`MAX_AHEAD`] outstanding, or past
    /// [`MuxLimits::max_open`] with the connections open; as
    /// [`MuxMessage::encode`]. Nothing changes.
    pub fn credit(&mut self, parts: Parts) -> Result<Vec<u8>> {
        if self.role != MuxRole::Server {
            return Err(Error::InvalidConfig(
                "a client grants no slots ahead".into(),
            ));
        }
        let slots = self.own_slices(&parts)?;
        let n = self.credited.len() + slots.len();
        if n > MAX_AHEAD || self.conns.len() + n > self.limits.max_open {
            return Err(Error::InvalidConfig(format!(
                "{n} slots ahead with {} connections open (at most {MAX_AHEAD}, and {} in all)",
                self.conns.len(),
                self.limits.max_open
            )));
        }
        let m = MuxMessage::Ahead { parts }.encode()?;
        self.credited.extend(slots);
        Ok(m)
    }

    /// Server: slots granted ahead and not opened yet.
    pub fn credited(&self) -> usize {
        self.credited.len()
    }

    /// Lanes opened ahead, in all: sent (client) or received (server).
    pub fn opened_ahead(&self) -> u64 {
        self.opened_ahead
    }

    /// Client: slots of the server's granted ahead, in hand.
    pub fn ahead_left(&self) -> usize {
        self.ahead.len()
    }

    /// Client: the answer an open ahead gets (the sections of the last
    /// [`MuxMessage::Ahead`]).
    pub fn ahead_sections(&self) -> &[(u16, Vec<u8>)] {
        &self.ahead_sections
    }

    /// Client: opens logical connection `tag` ahead, offering `parts` (its
    /// slices taken with [`Self::take_slot`]) and writing into a slot the
    /// server granted ahead: `None` when none is in hand; else the request
    /// id, the message, and what the server offers (as its answer would:
    /// the sections granted with the slot, the slot under `role`). The
    /// connection is open from now: write once the message is sent.
    ///
    /// # Errors
    /// As [`Self::open`]; nothing changes.
    pub fn open_ahead(
        &mut self,
        tag: u32,
        parts: Parts,
        role: u16,
    ) -> Result<Option<(u32, Vec<u8>, Parts)>> {
        self.may_open(tag)?;
        let Some(&slot) = self.ahead.last() else {
            return Ok(None);
        };
        let ours = self.own_slices(&parts)?;
        let req = self.next_req;
        let m = MuxMessage::OpenAhead {
            req,
            tag,
            parts,
            slot,
        }
        .encode()?;
        self.ahead.pop();
        self.opened_ahead += 1;
        self.opening_entry(tag, req, ours, vec![slot], true);
        let theirs = Parts {
            sections: self.ahead_sections.clone(),
            slices: vec![(role, slot)],
        };
        Ok(Some((req, m, theirs)))
    }

    /// Closes logical connection `tag`: call once this end writes into its
    /// rings no more; send the message, if any. Its slots come back with
    /// the peer's answer ([`MuxEvent::Closed`]). An open ahead not
    /// confirmed yet has no message now: it is closed when confirmed.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a tag not open here.
    pub fn close(&mut self, tag: u32) -> Result<Option<Vec<u8>>> {
        match self.conns.get_mut(&tag) {
            Some(e) if e.state == State::Open => {
                e.state = State::Closing;
                MuxMessage::Close { tag }.encode().map(Some)
            }
            Some(Entry {
                state:
                    State::Opening {
                        ahead: true,
                        abandoned,
                        ..
                    },
                ..
            }) => {
                *abandoned = true;
                Ok(None)
            }
            _ => Err(Error::InvalidConfig(format!("tag {tag} is not open"))),
        }
    }

    /// Handles one message from the peer.
    ///
    /// # Errors
    /// [`Error::MalformedHandshake`] for what the peer may not send: an
    /// open to a client or an answer to a server, a request or tag it
    /// does not have, a slice that is no free slot of an arena it granted
    /// us, a close of a connection not open; [`Error::LimitExceeded`] for
    /// arenas past [`MuxLimits::max_arena_bytes`] or [`MAX_ARENAS`].
    /// Close the shared connection: nothing was changed.
    pub fn handle(&mut self, m: MuxMessage) -> Result<MuxEvent> {
        let bad = |what: String| Err(Error::MalformedHandshake(format!("side channel: {what}")));
        match m {
            MuxMessage::Grant { arena, slot, len } => {
                self.peer
                    .grant(arena, slot, len, self.limits.max_arena_bytes)?;
                Ok(MuxEvent::Granted { arena, len })
            }
            MuxMessage::Open { req, tag, parts } => {
                self.may_be_asked(req, tag)?;
                let asked = self.reqs.len();
                if asked >= self.limits.max_pending {
                    return Ok(MuxEvent::Send(refusal(
                        req,
                        &format!(
                            "{asked} logical connects are waiting already (at most {})",
                            self.limits.max_pending
                        ),
                    )?));
                }
                // Slots granted ahead hold places too: their opens are
                // never refused.
                if self.conns.len() + self.credited.len() >= self.limits.max_open {
                    return Ok(MuxEvent::Send(refusal(
                        req,
                        &format!(
                            "{} logical connections are open already and {} granted ahead (at \
                             most {})",
                            self.conns.len(),
                            self.credited.len(),
                            self.limits.max_open
                        ),
                    )?));
                }
                let theirs = self.claim_all(&parts)?;
                self.reqs.insert(req, tag);
                self.conns.insert(
                    tag,
                    Entry {
                        state: State::Asked { req, ahead: false },
                        ours: Vec::new(),
                        theirs,
                    },
                );
                Ok(MuxEvent::OpenRequested {
                    req,
                    tag,
                    parts,
                    ahead: None,
                })
            }
            MuxMessage::OpenAhead {
                req,
                tag,
                parts,
                slot,
            } => {
                self.may_be_asked(req, tag)?;
                let Some(at) = self.credited.iter().position(|c| *c == slot) else {
                    return bad(format!(
                        "an open ahead into {slot:?}, no slot granted ahead"
                    ));
                };
                // Grants ahead counted against the limits: no refusal here.
                let theirs = self.claim_all(&parts)?;
                self.credited.swap_remove(at);
                self.opened_ahead += 1;
                self.reqs.insert(req, tag);
                self.conns.insert(
                    tag,
                    Entry {
                        state: State::Asked { req, ahead: true },
                        ours: vec![slot],
                        theirs,
                    },
                );
                Ok(MuxEvent::OpenRequested {
                    req,
                    tag,
                    parts,
                    ahead: Some(slot),
                })
            }
            MuxMessage::Ahead { parts } => {
                if self.role != MuxRole::Client {
                    return bad("slots granted ahead to the server".into());
                }
                if self.ahead.len() + parts.slices.len() > MAX_AHEAD {
                    return bad(format!(
                        "{} slots granted ahead (at most {MAX_AHEAD})",
                        self.ahead.len() + parts.slices.len()
                    ));
                }
                let claimed = self.claim_all(&parts)?;
                self.ahead.extend(claimed);
                self.ahead_sections = parts.sections;
                Ok(MuxEvent::Ahead)
            }
            MuxMessage::Opened { req, parts } => {
                let (tag, abandoned, ahead) = self.opening(req)?;
                if ahead && !parts.slices.is_empty() {
                    return bad(format!(
                        "an answer to request {req}, opened ahead, offering slices"
                    ));
                }
                let theirs = self.claim_all(&parts)?;
                self.reqs.remove(&req);
                let e = self.conns.get_mut(&tag).expect("opening");
                if !ahead {
                    e.theirs = theirs;
                }
                if abandoned {
                    e.state = State::Closing;
                    return Ok(MuxEvent::Send(MuxMessage::Close { tag }.encode()?));
                }
                e.state = State::Open;
                if ahead {
                    return Ok(MuxEvent::OpenedAhead { req, tag });
                }
                Ok(MuxEvent::Opened { req, tag, parts })
            }
            MuxMessage::Refused { req, reason } => {
                let (tag, _, ahead) = self.opening(req)?;
                self.reqs.remove(&req);
                if ahead {
                    self.forget(tag);
                    return Ok(MuxEvent::RefusedAhead {
                        req,
                        tag,
                        reason,
                        reply: MuxMessage::Closed { tag }.encode()?,
                    });
                }
                self.forget(tag);
                Ok(MuxEvent::Refused { req, tag, reason })
            }
            MuxMessage::Close { tag } => match self.conns.get(&tag).map(|e| e.state) {
                Some(State::Open) => {
                    self.forget(tag);
                    Ok(MuxEvent::PeerClosed {
                        tag,
                        reply: MuxMessage::Closed { tag }.encode()?,
                    })
                }
                // Both ends closed at once: each close answers the other.
                Some(State::Closing) => {
                    self.forget(tag);
                    Ok(MuxEvent::Closed { tag })
                }
                _ => bad(format!("a close of tag {tag}, which is not open")),
            },
            MuxMessage::Closed { tag } => match self.conns.get(&tag).map(|e| e.state) {
                Some(State::Closing) => {
                    self.forget(tag);
                    Ok(MuxEvent::Closed { tag })
                }
                _ => bad(format!("a closed of tag {tag}, which we are not closing")),
            },
        }
    }

    /// Client: the tag of request `req`, whether it was abandoned, and
    /// whether it was opened ahead.
    fn opening(&self, req: u32) -> Result<(u32, bool, bool)> {
        if self.role != MuxRole::Client {
            return Err(Error::MalformedHandshake(format!(
                "side channel: an answer (request {req}) sent to the server"
            )));
        }
        self.reqs
            .get(&req)
            .and_then(|tag| match self.conns.get(tag)?.state {
                State::Opening {
                    abandoned, ahead, ..
                } => Some((*tag, abandoned, ahead)),
                _ => None,
            })
            .ok_or_else(|| {
                Error::MalformedHandshake(format!(
                    "side channel: an answer to request {req}, which is not waiting"
                ))
            })
    }

    /// Claims every slice of `parts` (all or none).
    fn claim_all(&mut self, parts: &Parts) -> Result<Vec<Slice>> {
        let mut claimed = Vec::with_capacity(parts.slices.len());
        for (_, s) in &parts.slices {
            if let Err(e) = self.peer.claim(*s) {
                for c in claimed {
                    self.peer.release(c);
                }
                return Err(e);
            }
            claimed.push(*s);
        }
        Ok(claimed)
    }

    /// Drops `tag`: its slots back at both ends' books.
    fn forget(&mut self, tag: u32) {
        if let Some(e) = self.conns.remove(&tag) {
            for s in e.ours {
                self.give_back(s);
            }
            for s in e.theirs {
                self.peer.release(s);
            }
        }
    }
}

fn refusal(req: u32, reason: &str) -> Result<Vec<u8>> {
    MuxMessage::Refused {
        req,
        reason: reason.into(),
    }
    .encode()
}

#[cfg(test)]
mod tests;
