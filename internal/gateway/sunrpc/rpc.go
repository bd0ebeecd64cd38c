// Package sunrpc is an ONC RPC version 2 server over TCP (RFC 5531, with
// RFC 5531 §11's record marking), the transport of NFSv3 and MOUNT v3 at
// Arbor's NFS gateways (DESIGN.md §2.7; FSS §8's Orca presentation
// servers). It decodes calls, hands them to the program registered for
// them and sends the replies; it knows nothing of NFS.
//
// Invariants:
//  1. A record (all fragments of one message) is at most MaxRecordBytes;
//     a longer one closes the connection before it is buffered, so a
//     client cannot make the server allocate without bound.
//  2. Every call whose header can be read gets exactly one reply: an
//     unknown program PROG_UNAVAIL, an unknown version PROG_MISMATCH, an
//     unknown procedure PROC_UNAVAIL, arguments a program cannot decode
//     GARBAGE_ARGS, a failing procedure SYSTEM_ERR, an RPC version but 2
//     RPC_MISMATCH and a credential that cannot be parsed AUTH_BADCRED.
//     A message too short to hold a transaction id closes the connection.
//  3. A connection runs at most MaxInFlightPerConn calls at once; past it
//     the server stops reading from it (back-pressure through TCP), and
//     replies are written whole, one at a time.
//  4. Decoding never panics on any input (fuzzed: FuzzParseCall).
package sunrpc

import (
	"errors"
	"fmt"

	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// Message types and RPC version (RFC 5531 §9).
const (
	msgCall    = 0
	msgReply   = 1
	rpcVersion = 2
)

// Reply statuses (RFC 5531 §9).
const (
	msgAccepted = 0
	msgDenied   = 1

	rpcMismatch = 0
	authError   = 1
)

// AcceptStat is the status of an accepted call (RFC 5531 §9).
type AcceptStat uint32

// Accept statuses.
const (
	Success      AcceptStat = 0
	ProgUnavail  AcceptStat = 1
	ProgMismatch AcceptStat = 2
	ProcUnavail  AcceptStat = 3
	GarbageArgs  AcceptStat = 4
	SystemErr    AcceptStat = 5
)

// Authentication flavors and statuses (RFC 5531 §8.2, §9).
const (
	AuthNone = 0
	AuthSys  = 1

	authBadCred = 1
)

// Limits on what a call may carry.
const (
	// MaxAuthBytes bounds a credential's or verifier's body (RFC 5531).
	MaxAuthBytes = 400
	// MaxMachineNameBytes and MaxAuthGids bound AUTH_SYS's fields.
	MaxMachineNameBytes = 255
	MaxAuthGids         = 16
)

// ErrMalformed says a message could not be parsed as a call.
var ErrMalformed = errors.New("sunrpc: malformed call")

// Auth is an opaque authenticator: a flavor and its body.
type Auth struct {
	Flavor uint32
	Body   []byte
}

// SysCred is an AUTH_SYS credential (RFC 5531 Appendix A).
type SysCred struct {
	Stamp       uint32
	MachineName string
	Uid, Gid    uint32
	Gids        []uint32
}

// Call is one decoded call. Args aliases the record it came in.
type Call struct {
	Xid, Prog, Vers, Proc uint32
	Cred, Verf            Auth
	// Sys is the AUTH_SYS credential when Cred.Flavor is AuthSys.
	Sys  *SysCred
	Args []byte
}

// ParseCall decodes a call message. A message that is not a call, or
// whose header is cut short, gives ErrMalformed; an RPC version but 2 or
// an AUTH_SYS credential that does not parse gives an error the server
// answers with a denial. c.Xid is set whenever the message holds one.
func ParseCall(msg []byte) (c Call, err error) {
	r := xdr.NewReader(msg)
	c.Xid = r.Uint32()
	if r.Err() != nil {
		return c, fmt.Errorf("%w: no transaction id", ErrMalformed)
	}
	mtype := r.Uint32()
	if r.Err() == nil && mtype != msgCall {
		return c, fmt.Errorf("%w: message type %d is not a call", ErrMalformed, mtype)
	}
	rv := r.Uint32()
	c.Prog, c.Vers, c.Proc = r.Uint32(), r.Uint32(), r.Uint32()
	c.Cred.Flavor = r.Uint32()
	c.Cred.Body = r.Opaque(MaxAuthBytes)
	c.Verf.Flavor = r.Uint32()
	c.Verf.Body = r.Opaque(MaxAuthBytes)
	if r.Err() != nil {
		return c, fmt.Errorf("%w: %w", ErrMalformed, r.Err())
	}
	if rv != rpcVersion {
		return c, &versionError{got: rv}
	}
	if c.Cred.Flavor == AuthSys {
		s, err := ParseSysCred(c.Cred.Body)
		if err != nil {
			return c, &credError{err: err}
		}
		c.Sys = &s
	}
	c.Args = r.Rest()
	return c, nil
}

// ParseSysCred decodes an AUTH_SYS credential body.
func ParseSysCred(b []byte) (SysCred, error) {
	r := xdr.NewReader(b)
	var s SysCred
	s.Stamp = r.Uint32()
	s.MachineName = r.String(MaxMachineNameBytes)
	s.Uid, s.Gid = r.Uint32(), r.Uint32()
	n := r.Uint32()
	if r.Err() == nil && n > MaxAuthGids {
		return s, fmt.Errorf("AUTH_SYS with %d groups (the bound is %d)", n, MaxAuthGids)
	}
	for range n {
		s.Gids = append(s.Gids, r.Uint32())
	}
	if r.Err() != nil {
		return s, fmt.Errorf("AUTH_SYS credential: %w", r.Err())
	}
	if r.Remaining() != 0 {
		return s, fmt.Errorf("AUTH_SYS credential: %d bytes past its end", r.Remaining())
	}
	return s, nil
}

// versionError says a call's RPC version is not 2.
type versionError struct{ got uint32 }

func (e *versionError) Error() string { return fmt.Sprintf("sunrpc: RPC version %d (only 2)", e.got) }

// credError says a call's credential could not be parsed.
type credError struct{ err error }

func (e *credError) Error() string { return "sunrpc: bad credential: " + e.err.Error() }
func (e *credError) Unwrap() error { return e.err }

// EncodeCall builds a call message (for clients and tests).
func EncodeCall(c Call) []byte {
	w := xdr.NewWriter(nil)
	w.Uint32(c.Xid)
	w.Uint32(msgCall)
	w.Uint32(rpcVersion)
	w.Uint32(c.Prog)
	w.Uint32(c.Vers)
	w.Uint32(c.Proc)
	w.Uint32(c.Cred.Flavor)
	w.Opaque(c.Cred.Body)
	w.Uint32(c.Verf.Flavor)
	w.Opaque(c.Verf.Body)
	w.Raw(c.Args)
	return w.Bytes()
}

// EncodeSysCred encodes an AUTH_SYS credential body.
func EncodeSysCred(s SysCred) []byte {
	w := xdr.NewWriter(nil)
	w.Uint32(s.Stamp)
	w.String(s.MachineName)
	w.Uint32(s.Uid)
	w.Uint32(s.Gid)
	w.Uint32(uint32(len(s.Gids)))
	for _, g := range s.Gids {
		w.Uint32(g)
	}
	return w.Bytes()
}

// acceptedHeader starts an accepted reply with status st.
func acceptedHeader(xid uint32, st AcceptStat) *xdr.Writer {
	w := xdr.NewWriter(make([]byte, 0, 128))
	w.Uint32(xid)
	w.Uint32(msgReply)
	w.Uint32(msgAccepted)
	w.Uint32(AuthNone) // verifier
	w.Uint32(0)
	w.Uint32(uint32(st))
	return w
}

// mismatchReply is PROG_MISMATCH with the supported versions.
func mismatchReply(xid, low, high uint32) []byte {
	w := acceptedHeader(xid, ProgMismatch)
	w.Uint32(low)
	w.Uint32(high)
	return w.Bytes()
}

// deniedReply is MSG_DENIED: RPC_MISMATCH (versions 2..2) or AUTH_ERROR.
func deniedReply(xid uint32, rpcMis bool) []byte {
	w := xdr.NewWriter(nil)
	w.Uint32(xid)
	w.Uint32(msgReply)
	w.Uint32(msgDenied)
	if rpcMis {
		w.Uint32(rpcMismatch)
		w.Uint32(rpcVersion)
		w.Uint32(rpcVersion)
	} else {
		w.Uint32(authError)
		w.Uint32(authBadCred)
	}
	return w.Bytes()
}

// Reply is a decoded reply (for clients and tests).
type Reply struct {
	Xid uint32
	// Denied is set for MSG_DENIED; Stat is the accept status otherwise.
	Denied bool
	Stat   AcceptStat
	// Results are the procedure's results (SUCCESS) or the mismatch's
	// versions.
	Results []byte
}

// ParseReply decodes a reply message.
func ParseReply(msg []byte) (Reply, error) {
	r := xdr.NewReader(msg)
	var p Reply
	p.Xid = r.Uint32()
	if mt := r.Uint32(); r.Err() == nil && mt != msgReply {
		return p, fmt.Errorf("sunrpc: message type %d is not a reply", mt)
	}
	switch r.Uint32() {
	case msgAccepted:
		r.Uint32()
		r.Opaque(MaxAuthBytes)
		p.Stat = AcceptStat(r.Uint32())
	case msgDenied:
		p.Denied = true
	default:
		r.Fail(errors.New("sunrpc: bad reply status"))
	}
	if r.Err() != nil {
		return p, fmt.Errorf("sunrpc: reply: %w", r.Err())
	}
	p.Results = r.Rest()
	return p, nil
}
