package store_test

import (
	"testing"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/store"
)

// TestFileNameIsTheDefault: the store's snapshot name is the default
// defined in pkg/app, which tools and tests use to find the checkpoint.
func TestFileNameIsTheDefault(t *testing.T) {
	if store.FileName != app.CheckpointFileName {
		t.Fatalf("store.FileName = %q, app.CheckpointFileName = %q", store.FileName, app.CheckpointFileName)
	}
}

// TestKubeletFileNameIsTheDefault: the mirror's name is the default defined
// in pkg/app.
func TestKubeletFileNameIsTheDefault(t *testing.T) {
	if store.KubeletFileName != app.KubeletCheckpointFileName {
		t.Fatalf("store.KubeletFileName = %q, app.KubeletCheckpointFileName = %q", store.KubeletFileName, app.KubeletCheckpointFileName)
	}
}
