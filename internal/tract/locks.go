package tract

import "sync"

// keyLocks serialises the operations on each tract: the primary holds a
// tract's lock from giving a write its stamp until every replica has it,
// which is what orders the writes of one tract (DESIGN §2.3).
type keyLocks struct {
	mu sync.Mutex
	m  map[tractKey]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

// lock locks k and returns its unlock.
func (l *keyLocks) lock(k tractKey) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[tractKey]*keyLock{}
	}
	kl := l.m[k]
	if kl == nil {
		kl = &keyLock{}
		l.m[k] = kl
	}
	kl.refs++
	l.mu.Unlock()
	kl.mu.Lock()
	return func() {
		kl.mu.Unlock()
		l.mu.Lock()
		kl.refs--
		if kl.refs == 0 {
			delete(l.m, k)
		}
		l.mu.Unlock()
	}
}
