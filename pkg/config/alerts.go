package config

import (
	"fmt"
	"time"
)

// alertPoster is implemented by the config of a sink type whose requests
// can post alerts that expire unless sent again (Alertmanager's endsAt).
// AlertLifetime says whether the sink posts such alerts, whether surely
// (a preset) or seemingly (its URL), and how long one send keeps an alert
// active (0: unknown).
type alertPoster interface {
	AlertLifetime() (lifetime time.Duration, sure, posts bool)
}

// validateAlertLifetimes checks that a sink's alerts outlive the gap
// between its re-sends (replayEvery), as Prometheus re-sends an alert
// every interval with endsAt four intervals ahead: otherwise an alert
// expires while its object is still in the view. A sink that surely posts
// alerts (a preset) is refused; one whose URL says so is warned.
func (c *Config) validateAlertLifetimes() []error {
	var errs []error
	for i, s := range c.Sinks {
		p, ok := s.Spec.(alertPoster)
		if !ok {
			continue
		}
		life, sure, posts := p.AlertLifetime()
		if !posts {
			continue
		}
		at := fmt.Sprintf("sinks[%d].replayEvery", i)
		problem := ErrorAt
		if !sure {
			problem = WarningAt
		}
		every := s.ReplayEvery.D()
		switch {
		case every == 0 && life == 0:
			errs = append(errs, problem(at, "the alerts this sink posts expire unless sent again: set replayEvery to a quarter of their endsAt's distance or less"))
		case every == 0:
			errs = append(errs, problem(at, "the alerts this sink posts end %s after each send (endsAt): without a replay to send them again they expire while their objects are still in the view; set replayEvery to %s or less", life, life/4))
		case life == 0:
		case 2*every > life:
			errs = append(errs, problem(at, "%s: the alerts this sink posts end %s after each send (endsAt), so one late re-send expires an alert while its object is still in the view; set it to %s or less (or endsAt further ahead)", every, life, life/4))
		case 4*every > life:
			errs = append(errs, WarningAt(at, "%s: the alerts this sink posts end %s after each send (endsAt): fewer than 4 re-sends fit in that, so a few failed ones expire an alert; %s or less is safer", every, life, life/4))
		}
	}
	return errs
}
