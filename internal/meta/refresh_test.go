package meta

import (
	"context"
	"testing"
	"time"
)

// TestPlacementRefreshOnlyWhereTablesAre: only a server that serves a
// table asks its peers for their statistics once a second (placement and
// automatic splits decide only for its own tables); the others keep
// nothing and ask nobody, and a server that gains a table starts asking.
func TestPlacementRefreshOnlyWhereTablesAre(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	x := c.newFS("refresh")
	owner := c.owner(ctx, x.f, 1)
	if owner == 0 {
		t.Fatal("no server owns the new file system's root table")
	}
	members := func(id uint64) int {
		s := c.servers[id].srv
		s.place.mu.Lock()
		defer s.place.mu.Unlock()
		return len(s.place.members)
	}
	serves := func(id uint64) bool {
		s := c.servers[id].srv
		s.leaseMu.Lock()
		defer s.leaseMu.Unlock()
		return len(s.leases) > 0
	}
	for members(owner) != 3 {
		if ctx.Err() != nil {
			t.Fatalf("the owner (%d) heard from %d servers, want 3", owner, members(owner))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Two refresh periods later, the servers with no table heard nobody.
	time.Sleep(2500 * time.Millisecond)
	idle := 0
	for id := range uint64(3) {
		id++
		if serves(id) {
			continue
		}
		idle++
		if n := members(id); n != 0 {
			t.Errorf("server %d serves no table but heard from %d servers", id, n)
		}
	}
	if idle == 0 {
		t.Fatal("every server serves a table: nothing to check")
	}
}
