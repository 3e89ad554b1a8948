package allocator

import (
	"slices"
	"testing"
)

// The kubelet's devicesToAllocate: must-include first, then the answered
// IDs that are available in the plugin's order up to the count, then the
// lowest free IDs; what was wrong with the answer is reported, never fatal.
func TestMergePreferred(t *testing.T) {
	avail := []string{"a", "b", "c", "d", "e"}
	tests := []struct {
		name     string
		answer   []string
		must     []string
		count    int
		want     []string
		problems bool
	}{
		{"as answered", []string{"e", "c"}, nil, 2, []string{"c", "e"}, false},
		{"answer with must-include", []string{"b", "e"}, []string{"b"}, 2, []string{"b", "e"}, false},
		{"empty", []string{}, nil, 2, []string{"a", "b"}, true},
		{"nil", nil, []string{"c"}, 2, []string{"a", "c"}, true},
		{"short", []string{"e"}, nil, 3, []string{"a", "b", "e"}, true},
		{"foreign", []string{"zz", "d", "yy"}, nil, 2, []string{"a", "d"}, true},
		{"only foreign", []string{"x", "y"}, nil, 2, []string{"a", "b"}, true},
		{"too long: plugin's order wins", []string{"e", "d", "c"}, nil, 2, []string{"d", "e"}, true},
		{"repeated", []string{"d", "d"}, nil, 2, []string{"a", "d"}, true},
		{"must-include ignored by the plugin", []string{"d", "e"}, []string{"a"}, 2, []string{"a", "d"}, true},
		{"all", []string{"c"}, nil, 5, avail, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := mergePreferred(tc.answer, avail, tc.must, tc.count)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("devices = %v, want %v", got, tc.want)
			}
			if (len(problems) > 0) != tc.problems {
				t.Fatalf("problems = %q, want some: %v", problems, tc.problems)
			}
		})
	}
}
