package owners

import (
	"testing"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// The shared control plane is stopped after the package's tests.
func TestMain(m *testing.M) { testenv.Main(m) }
