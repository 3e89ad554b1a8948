package drivers_test

import (
	"os"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/nodeplug/nodeplug/pkg/telemetry"
)

// TestMain installs a tracer provider and nodeplug's propagator, as the
// services do, so that the driver calls carry their trace.
func TestMain(m *testing.M) {
	otel.SetTextMapPropagator(telemetry.Propagator)
	otel.SetTracerProvider(sdktrace.NewTracerProvider())
	os.Exit(m.Run())
}
