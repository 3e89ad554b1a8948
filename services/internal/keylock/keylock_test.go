package keylock

import (
	"sync"
	"testing"
)

func TestMutexSerialisesPerKey(t *testing.T) {
	var k Mutex
	var wg sync.WaitGroup
	var a, b int
	counts := map[string]*int{"a": &a, "b": &b}
	for i := range 200 {
		key := []string{"a", "b"}[i%2]
		wg.Go(func() {
			unlock := k.Lock(key)
			*counts[key]++ // guarded by the key's lock only: the race detector checks it
			unlock()
		})
	}
	wg.Wait()
	if a != 100 || b != 100 || k.held() != 0 {
		t.Fatalf("counts %d %d, entries left %d", a, b, k.held())
	}
}

func TestMutexKeysIndependent(t *testing.T) {
	var k Mutex
	unlockA := k.Lock("a")
	defer unlockA()
	// With "a" held, "b" is free: this would deadlock otherwise.
	unlockB := k.Lock("b")
	unlockB()
	if k.held() != 1 {
		t.Fatalf("%d entries, want 1 (a)", k.held())
	}
}
