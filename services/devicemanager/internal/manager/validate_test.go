package manager

import (
	"strings"
	"sync"
	"testing"
)

func TestIsExtendedResourceName(t *testing.T) {
	tests := []struct {
		name string
		want bool
	}{
		{"example.com/gpu", true},
		{"vendor.io/a_b.c-d", true},
		{"gpu", false},
		{"kubernetes.io/gpu", false},
		{"requests.example.com/gpu", false},
		{"example.com/", false},
		{"/gpu", false},
		{"Example.com/gpu", false},
		{"example.com/-gpu", false},
		{"example.com/" + strings.Repeat("a", 64), false},
		{"a/b/c", false},
	}
	for _, tc := range tests {
		if got := IsExtendedResourceName(tc.name); got != tc.want {
			t.Errorf("IsExtendedResourceName(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestKeyedMutexSerialisesPerKey(t *testing.T) {
	var k keyedMutex
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
	if a != 100 || b != 100 || len(k.m) != 0 {
		t.Fatalf("counts %d %d, entries left %d", a, b, len(k.m))
	}
}
