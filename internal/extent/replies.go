package extent

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/extent/extentpb"
)

// The duplicate-reply memory (issue 13): a write request (Commit, TxnStep)
// carries a client-chosen request id, which the leader puts in the
// command. The first command of an id that succeeds records its result in
// the extent's state, under the id, for replyMemory of extent clock; a
// later command of the same id is not applied again but answers that
// result (with the first one's raft index). Because the memory is
// replicated state (applied deterministically, carried by snapshots), it
// survives leader changes and restarts: a client may resend a write whose
// reply it lost, to any replica, and the write runs once.
//
// Refusals are remembered too: a client that saw the refusal of a request
// whose duplicate is still on its way must not have it succeed later. So
// a refused command with a request id writes its reply, and nothing else
// (invariant 2 in doc.go).
//
//	r <id:8>                expiry:8 (extent clock, ms) then the CommandResult
//	y <expiry:8> <id:8>     index of the above by expiry (empty value)
//
// Bounds: maxRememberedReplies per extent (the oldest are forgotten
// first) and replyMemory; up to maxGCPerCommand expired replies are
// collected by each command, like tombstones.
const (
	prefixReply       = 'r'
	prefixReplyExpiry = 'y'
	// replyMemory is how long a reply is remembered: longer than any
	// retry loop keeps resending a request (the extent client stops
	// resending a write after ReplyMemoryRetryWindow).
	replyMemory = 2 * 60 * 1000 // ms
	// maxRememberedReplies bounds the memory of one extent.
	maxRememberedReplies = 1 << 14
)

func replyKey(id uint64) []byte { return u64Key(prefixReply, id) }

func replyExpiryKey(at int64, id uint64) []byte {
	return binary.BigEndian.AppendUint64(u64Key(prefixReplyExpiry, uint64(max(at, 0))), id)
}

// rememberedReply returns the remembered result of request id, if it has
// not expired at the applier's clock.
func (a *applier) rememberedReply(id uint64) (*pb.CommandResult, bool, error) {
	v, err := getOptional(a.w, replyKey(id))
	if err != nil || v == nil {
		return nil, false, err
	}
	if len(v) < 8 {
		return nil, false, fmt.Errorf("%w: reply record of %d bytes", errCorrupt, len(v))
	}
	if int64(binary.BigEndian.Uint64(v)) <= a.clock {
		return nil, false, nil // expired; collected soon
	}
	var res pb.CommandResult
	if err := proto.Unmarshal(v[8:], &res); err != nil {
		return nil, false, fmt.Errorf("%w: reply record: %v", errCorrupt, err)
	}
	return &res, true, nil
}

// rememberReply records res as the reply to request id, forgetting the
// oldest reply when the memory is full.
func (a *applier) rememberReply(id uint64, res *pb.CommandResult) error {
	if old, err := getOptional(a.w, replyKey(id)); err != nil {
		return err
	} else if len(old) >= 8 {
		// An expired reply of the same id, not yet collected: replace it.
		if err := a.forgetReply(int64(binary.BigEndian.Uint64(old)), id); err != nil {
			return err
		}
	}
	if a.meta.RememberedReplies >= maxRememberedReplies {
		if err := a.collectReplies(1, true); err != nil {
			return err
		}
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(res)
	if err != nil {
		return err
	}
	expiry := a.clock + replyMemory
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(body)), uint64(expiry))
	if err := a.w.Set(replyKey(id), append(v, body...)); err != nil {
		return err
	}
	if err := a.w.Set(replyExpiryKey(expiry, id), nil); err != nil {
		return err
	}
	a.meta.RememberedReplies++
	if a.meta.RepliesDueUnixMs == 0 || expiry < a.meta.RepliesDueUnixMs {
		a.meta.RepliesDueUnixMs = expiry
	}
	a.dirty = true
	return nil
}

func (a *applier) forgetReply(at int64, id uint64) error {
	if err := a.w.Delete(replyKey(id)); err != nil {
		return err
	}
	if err := a.w.Delete(replyExpiryKey(at, id)); err != nil {
		return err
	}
	if a.meta.RememberedReplies > 0 {
		a.meta.RememberedReplies--
	}
	return nil
}

// collectReplies forgets up to n replies in expiry order: only expired
// ones, unless force (the memory is full). It keeps RepliesDueUnixMs the
// expiry of the oldest one left (0: none). Deterministic: it depends on
// the applied clock and the state only.
func (a *applier) collectReplies(n int, force bool) error {
	if !force && (a.meta.RepliesDueUnixMs == 0 || a.clock < a.meta.RepliesDueUnixMs) {
		return nil
	}
	var keys [][]byte
	errEnough := fmt.Errorf("enough")
	err := a.w.Scan([]byte{prefixReplyExpiry}, []byte{prefixReplyExpiry + 1}, func(k, _ []byte) error {
		keys = append(keys, append([]byte(nil), k...))
		if len(keys) > n {
			return errEnough
		}
		return nil
	})
	if err != nil && err != errEnough {
		return err
	}
	a.meta.RepliesDueUnixMs = 0
	for i, k := range keys {
		if len(k) != 17 {
			return fmt.Errorf("%w: reply expiry key of %d bytes", errCorrupt, len(k))
		}
		at := int64(binary.BigEndian.Uint64(k[1:]))
		if i == n || (!force && at > a.clock) {
			a.meta.RepliesDueUnixMs = at
			break
		}
		if err := a.forgetReply(at, binary.BigEndian.Uint64(k[9:])); err != nil {
			return err
		}
	}
	return nil
}
