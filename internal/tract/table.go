package tract

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// GUID names a blob (FDS §2.1: 128 bits, chosen by the application or at
// random).
type GUID [16]byte

// NewGUID returns a random GUID.
func NewGUID() GUID {
	var g GUID
	_, _ = rand.Read(g[:])
	return g
}

// ParseGUID parses 32 hexadecimal digits (dashes are ignored).
func ParseGUID(s string) (GUID, error) {
	var g GUID
	clean := strings.ReplaceAll(strings.TrimSpace(s), "-", "")
	if len(clean) != 2*len(g) {
		return g, fmt.Errorf("blob id %q: want 32 hexadecimal digits, got %d characters", s, len(clean))
	}
	if _, err := hex.Decode(g[:], []byte(clean)); err != nil {
		return g, fmt.Errorf("blob id %q: %w", s, err)
	}
	return g, nil
}

// guidFromBytes checks a wire GUID.
func guidFromBytes(b []byte) (GUID, error) {
	var g GUID
	if len(b) != len(g) {
		return g, fmt.Errorf("guid is %d bytes, want %d", len(b), len(g))
	}
	copy(g[:], b)
	return g, nil
}

// String is the GUID's 32 hexadecimal digits.
func (g GUID) String() string { return hex.EncodeToString(g[:]) }

// MetadataTract is the number of a blob's metadata tract (FDS §2.3).
const MetadataTract int64 = -1

// blobHash is the GUID's hash that places the blob's first tract in the
// TLT: the first 8 bytes of SHA-1, as FDS uses (§2.2).
func blobHash(g GUID) uint64 {
	sum := sha1.Sum(g[:])
	return binary.BigEndian.Uint64(sum[:8])
}

// Locate returns the TLT row of tract `tract` of blob g in a table of rows
// rows: (hash(g) + tract) mod rows (FDS §2.2). Adding the tract number
// outside the hash walks a blob's tracts through consecutive rows, so a
// large blob uses every row equally. The metadata tract (-1) lies in the
// row before tract 0.
func Locate(g GUID, tract int64, rows int) int {
	if rows <= 0 {
		return 0
	}
	n := uint64(rows)
	t := tract % int64(rows)
	if t < 0 {
		t += int64(rows)
	}
	return int((blobHash(g)%n + uint64(t)) % n)
}

// ServerID names a tractserver: one disk of one node.
type ServerID struct {
	Node uint64
	Disk uint32
}

func (s ServerID) String() string { return fmt.Sprintf("%d/%d", s.Node, s.Disk) }

func serverFromProto(ts *dpb.TractServer) ServerID {
	return ServerID{Node: ts.GetNodeId(), Disk: ts.GetDiskIndex()}
}

func (s ServerID) toProto() *dpb.TractServer {
	return &dpb.TractServer{NodeId: s.Node, DiskIndex: s.Disk}
}

func (s ServerID) less(o ServerID) bool {
	return s.Node < o.Node || s.Node == o.Node && s.Disk < o.Disk
}

// Pending is a tractserver catching up to take over a slot (FDS §3.4).
type Pending struct {
	Slot   int
	Server ServerID
}

// Row is one entry of the TLT. Slots[0] is the primary; a blob with
// replication r uses Slots[:r] (FDS §3.3).
type Row struct {
	Version uint64
	Slots   []ServerID
	Pending []Pending
}

// Has reports whether s holds a slot or a pending entry of the row.
func (r Row) Has(s ServerID) bool {
	_, _, ok := r.RoleOf(s)
	return ok
}

// RoleOf returns s's slot in the row and whether it is a pending entry for
// it; ok is false if s is not in the row.
func (r Row) RoleOf(s ServerID) (slot int, pending bool, ok bool) {
	for i, m := range r.Slots {
		if m == s {
			return i, false, true
		}
	}
	for _, p := range r.Pending {
		if p.Server == s {
			return p.Slot, true, true
		}
	}
	return 0, false, false
}

// Targets returns the servers a write of replication r goes to after the
// primary: slots 1..r-1 and the pending entries of slots below r.
func (r Row) Targets(replication int) []ServerID {
	var out []ServerID
	for i := 1; i < replication && i < len(r.Slots); i++ {
		out = append(out, r.Slots[i])
	}
	for _, p := range r.Pending {
		if p.Slot < replication {
			out = append(out, p.Server)
		}
	}
	return out
}

func (r Row) clone() Row {
	return Row{Version: r.Version, Slots: append([]ServerID(nil), r.Slots...), Pending: append([]Pending(nil), r.Pending...)}
}

func (r Row) String() string {
	var b strings.Builder
	for i, s := range r.Slots {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(s.String())
	}
	for _, p := range r.Pending {
		fmt.Fprintf(&b, " +%d:%s", p.Slot, p.Server)
	}
	return b.String()
}

// Table is a decoded, immutable tract locator table.
type Table struct {
	Version     uint64
	TractSize   int
	Replication int
	Rows        []Row
}

// TableFromProto decodes and checks a TLT from the directory.
func TableFromProto(p *dpb.TLT) (*Table, error) {
	if p == nil {
		return nil, fmt.Errorf("no TLT")
	}
	k := int(p.GetReplication())
	if k < 1 || len(p.GetRows()) == 0 {
		return nil, fmt.Errorf("TLT version %d: replication %d, %d rows", p.GetVersion(), k, len(p.GetRows()))
	}
	if p.GetTractSizeBytes() < minTractSizeBytes || p.GetTractSizeBytes() > maxTractSizeBytes {
		return nil, fmt.Errorf("TLT version %d: tract size %d is outside [%d, %d] (the tract store's limits)",
			p.GetVersion(), p.GetTractSizeBytes(), minTractSizeBytes, maxTractSizeBytes)
	}
	t := &Table{Version: p.GetVersion(), TractSize: int(p.GetTractSizeBytes()), Replication: k, Rows: make([]Row, len(p.GetRows()))}
	for i, r := range p.GetRows() {
		if len(r.GetSlots()) != k {
			return nil, fmt.Errorf("TLT row %d has %d slots, replication is %d", i, len(r.GetSlots()), k)
		}
		row := Row{Version: r.GetVersion(), Slots: make([]ServerID, k)}
		for j, s := range r.GetSlots() {
			row.Slots[j] = serverFromProto(s)
		}
		for _, pe := range r.GetPending() {
			if int(pe.GetSlot()) >= k {
				return nil, fmt.Errorf("TLT row %d: pending entry for slot %d of %d", i, pe.GetSlot(), k)
			}
			row.Pending = append(row.Pending, Pending{Slot: int(pe.GetSlot()), Server: serverFromProto(pe.GetServer())})
		}
		t.Rows[i] = row
	}
	return t, nil
}

// rowToProto encodes a row's slots and pending entries.
func rowToProto(r Row) ([]*dpb.TractServer, []*dpb.PendingEntry) {
	slots := make([]*dpb.TractServer, len(r.Slots))
	for i, s := range r.Slots {
		slots[i] = s.toProto()
	}
	var pending []*dpb.PendingEntry
	for _, p := range r.Pending {
		pending = append(pending, &dpb.PendingEntry{Slot: uint32(p.Slot), Server: p.Server.toProto()})
	}
	return slots, pending
}

// Locate returns the row index of a tract.
func (t *Table) Locate(g GUID, tract int64) int { return Locate(g, tract, len(t.Rows)) }

// Servers returns every server in the table (slots and pending), sorted.
func (t *Table) Servers() []ServerID {
	seen := map[ServerID]bool{}
	for _, r := range t.Rows {
		for _, s := range r.Slots {
			seen[s] = true
		}
		for _, p := range r.Pending {
			seen[p.Server] = true
		}
	}
	return sortedServers(seen)
}

// Appearances counts each server's slots and pending entries.
func (t *Table) Appearances() map[ServerID]int {
	c := map[ServerID]int{}
	for _, r := range t.Rows {
		for _, s := range r.Slots {
			c[s]++
		}
		for _, p := range r.Pending {
			c[p.Server]++
		}
	}
	return c
}
