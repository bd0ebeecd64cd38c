package directory

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/raftengine"
)

// Idempotent requests. A client may send one write twice: it retries after
// an ambiguous failure (the reply was lost), and the fault-injection switch
// duplicates calls on purpose. Applying a conditional write twice would
// break linearizability (the second copy could land after someone else's
// write), so every client call carries a request id (the
// requestIDMetadataKey header, fixed across its retries), the service puts
// it in the command, and the state machine remembers the result of each
// request that succeeded, keyed by id, for requestWindowEntries log entries.
// A repeat within the window gets the first result and changes nothing. A
// request that failed changed nothing, so running it again is the same as
// running it once, later; it is not remembered.
//
// Eviction is deterministic (by log index), so every replica remembers the
// same requests.

const (
	// requestIDMetadataKey is the gRPC metadata header carrying the id.
	requestIDMetadataKey = "arbor-request-id"
	// maxRequestIDBytes bounds a request id.
	maxRequestIDBytes = 32
	// requestWindowEntries is how many log entries a success is remembered
	// for; a client's retries of one call span seconds, a tiny fraction.
	requestWindowEntries = 100_000
)

func requestKey(id []byte) []byte { return append(append([]byte(nil), prefixRequest...), id...) }

func requestIndexKey(index uint64, id []byte) []byte {
	k := binary.BigEndian.AppendUint64(append([]byte(nil), prefixRequestIndex...), index)
	return append(k, id...)
}

// repeatedRequest returns the remembered result of request id, or nil.
func repeatedRequest(r raftengine.Reader, id []byte) (*pb.CommandResult, error) {
	if len(id) == 0 {
		return nil, nil
	}
	v, err := r.Get(requestKey(id))
	if errors.Is(err, raftengine.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec pb.RequestRecord
	if err := proto.Unmarshal(v, &rec); err != nil {
		return nil, fmt.Errorf("decode request record: %w", err)
	}
	return rec.GetResult(), nil
}

// rememberRequest records the successful result of request id applied at
// index, and forgets requests that fell out of the window. *pruned is the
// index below which every request is forgotten already (0: unknown); the
// scan starts there, not at the prefix, so it does not walk the deleted
// keys pebble keeps until a compaction (every apply did, and the
// directory's CPU grew with the requests of the last hours).
func rememberRequest(w raftengine.Writer, index uint64, id []byte, res *pb.CommandResult, pruned *uint64) error {
	if len(id) == 0 {
		return nil
	}
	v, err := proto.MarshalOptions{Deterministic: true}.Marshal(&pb.RequestRecord{Index: index, Result: res})
	if err != nil {
		return err
	}
	if err := w.Set(requestKey(id), v); err != nil {
		return err
	}
	if err := w.Set(requestIndexKey(index, id), nil); err != nil {
		return err
	}
	if index <= requestWindowEntries {
		return nil
	}
	var expired [][]byte
	below := index - requestWindowEntries
	if *pruned >= below {
		return nil
	}
	start := binary.BigEndian.AppendUint64(append([]byte(nil), prefixRequestIndex...), *pruned)
	end := binary.BigEndian.AppendUint64(append([]byte(nil), prefixRequestIndex...), below)
	if err := w.Scan(start, end, func(k, _ []byte) error {
		expired = append(expired, append([]byte(nil), k...))
		return nil
	}); err != nil {
		return err
	}
	for _, k := range expired {
		if err := w.Delete(requestKey(k[len(prefixRequestIndex)+8:])); err != nil {
			return err
		}
		if err := w.Delete(k); err != nil {
			return err
		}
	}
	*pruned = below
	return nil
}
