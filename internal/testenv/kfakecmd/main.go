// Command kfakecmd runs franz-go's kfake, an in-memory Kafka cluster, as a
// process of its own, for end-to-end tests that kill and restart the
// broker under the bridge. With -data-dir its topics (records, offsets,
// configs) are written there and loaded again at start, so a restart,
// even after a SIGKILL with -sync, keeps what it acknowledged.
//
// It listens on 127.0.0.1 only, prints its address on stdout once it
// serves, and closes (persisting) on SIGTERM or SIGINT.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	port := flag.Int("port", 0, "port on 127.0.0.1 (required)")
	dataDir := flag.String("data-dir", "", "persist the cluster's state here and load it at start")
	sync := flag.Bool("sync", true, "fsync every produced batch before acknowledging it (acks survive a SIGKILL)")
	partitions := flag.Int("partitions", 4, "partitions of topics created without a count")
	cleanerMS := flag.Int("cleaner-ms", 0, "compact topics with cleanup.policy=compact every this many ms (0: kfake's default, an hour)")
	flag.Parse()
	if *port <= 0 || *port > 65535 {
		fmt.Fprintln(os.Stderr, "kfakecmd: -port is required")
		os.Exit(2)
	}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(*port), kfake.DefaultNumPartitions(*partitions)}
	if *dataDir != "" {
		opts = append(opts, kfake.DataDir(*dataDir))
		if *sync {
			opts = append(opts, kfake.SyncWrites())
		}
	}
	if *cleanerMS > 0 {
		opts = append(opts, kfake.BrokerConfigs(map[string]string{"log.cleaner.backoff.ms": strconv.Itoa(*cleanerMS)}))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfakecmd:", err)
		os.Exit(1)
	}
	for _, addr := range c.ListenAddrs() {
		fmt.Println(addr)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	c.Close()
}
