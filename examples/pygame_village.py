"""The example village in a real pygame loop: NPCs as sprites, speech bubbles that type out
as the model streams the line, arrow keys to walk.

    python3 examples/pygame_village.py                      # a window; needs pygame
    SDL_VIDEODRIVER=dummy python3 examples/pygame_village.py --frames 300 --screenshot out.png

Keys: arrows walk, 1 greet, 2 ask rumors, 3 trade, 4 threaten, 5 farewell (to the nearest NPC
in range), N toggles night, Esc quits. ``--autopilot`` (always on headless) walks the scripted
traveller of ``flashnpc demo`` instead. The world runs with ``stream=True``: lines decode in a worker
thread and arrive as LinePiece events, so the frame never waits on the model.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Any

import pygame

from plugin import Line, LineDropped, LinePiece, World
from plugin.village import PlayerScript, build_village

SCALE = 9.0  # pixels per metre
BUBBLE = (255, 255, 240)
STATE_COLORS = {
    "patrol": (142, 202, 230), "idle": (200, 200, 200), "alert": (255, 179, 71), "combat": (255, 105, 97),
    "flee": (244, 166, 215), "rest": (184, 184, 255), "working": (181, 228, 140), "friendly": (119, 221, 119),
}
KEY_INTENTS = {pygame.K_1: "greet", pygame.K_2: "ask_rumors", pygame.K_3: "trade", pygame.K_4: "threaten",
               pygame.K_5: "farewell"}
BUBBLE_SECONDS = 5.0


@dataclass
class Bubble:
    text: str
    request_id: int
    until: float  # game time the bubble disappears (inf while the line is streaming)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="FlashNPC village in pygame")
    ap.add_argument("--frames", type=int, default=0, help="stop after N frames (0: until closed)")
    ap.add_argument("--screenshot", default=None, help="save the last frame to this PNG")
    ap.add_argument("--autopilot", action="store_true",
                    help="walk the scripted traveller (always on with SDL_VIDEODRIVER=dummy)")
    ap.add_argument("--npcs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="model directory (default: the shipped model)")
    ap.add_argument("--size", default="960x540", help="window size, WxH")
    ap.add_argument("--day", type=float, default=120.0, help="seconds of one autopilot day-and-night walk")
    return ap.parse_args(argv)


def wrap(font: pygame.font.Font, text: str, width: int) -> list[str]:
    lines: list[str] = []
    current = ""
    for word in text.split():
        trial = f"{current} {word}".strip()
        if current and font.size(trial)[0] > width:
            lines.append(current)
            current = word
        else:
            current = trial
    if current:
        lines.append(current)
    return lines or [""]


def draw_bubble(screen: pygame.Surface, font: pygame.font.Font, text: str, anchor: tuple[int, int]) -> None:
    rows = wrap(font, text, 220)
    h = font.get_linesize()
    w = max(font.size(r)[0] for r in rows) + 16
    box = pygame.Rect(0, 0, max(w, 30), h * len(rows) + 10)
    box.midbottom = (anchor[0], anchor[1] - 14)
    box.clamp_ip(screen.get_rect())
    pygame.draw.rect(screen, BUBBLE, box, border_radius=8)
    pygame.draw.rect(screen, (40, 40, 40), box, width=1, border_radius=8)
    pygame.draw.polygon(screen, BUBBLE, [(anchor[0] - 5, box.bottom - 1), (anchor[0] + 5, box.bottom - 1),
                                         (anchor[0], anchor[1] - 6)])
    for i, r in enumerate(rows):
        screen.blit(font.render(r, True, (20, 20, 20)), (box.x + 8, box.y + 5 + i * h))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))
    from runtime.client.generator import LineGenerator

    gen = LineGenerator.load(args.model)
    world = World(gen, seed=args.seed, stream=True, speech_cooldown=15.0)
    people = build_village(world, args.npcs)
    names = {r.npc_id: r.name for r in people}
    script = PlayerScript(people, args.day)
    world.add_player("aria", "Aria", (0.0, 0.0), reputation="friendly")

    pygame.display.init()  # no mixer: the example has no sound
    pygame.font.init()
    screen = pygame.display.set_mode((w, h))
    pygame.display.set_caption("FlashNPC village")
    font = pygame.font.Font(None, 20)
    small = pygame.font.Font(None, 16)
    clock = pygame.time.Clock()
    headless = pygame.display.get_driver() == "dummy"
    autopilot = args.autopilot or headless  # nobody presses arrow keys on a dummy display
    bubbles: dict[Any, Bubble] = {}
    night = False
    t_prev = -1.0
    frame = 0
    dt = 1.0 / 60
    running = True

    def handle(events: list[Any]) -> None:
        for ev in events:
            if isinstance(ev, LinePiece):
                bubbles[ev.npc_id] = Bubble(ev.text, ev.request_id, math.inf)
            elif isinstance(ev, Line):
                bubbles[ev.npc_id] = Bubble(ev.text, ev.request_id, world.time + BUBBLE_SECONDS)
                print(f"{names.get(ev.npc_id, ev.npc_id)} ({ev.state}, {ev.intent}): {ev.text}"
                      f"  [{ev.latency_ms:.0f} ms{', fallback' if ev.fallback else ''}]")
            elif isinstance(ev, LineDropped):
                b = bubbles.get(ev.npc_id)
                if b is not None and b.request_id == ev.request_id:
                    del bubbles[ev.npc_id]

    try:
        while running:
            for event in pygame.event.get():
                if event.type == pygame.QUIT or (event.type == pygame.KEYDOWN and event.key == pygame.K_ESCAPE):
                    running = False
                elif event.type == pygame.KEYDOWN and event.key == pygame.K_n:
                    night = not night
                    world.set_context(time_of_day="night" if night else "day")
                elif event.type == pygame.KEYDOWN and event.key in KEY_INTENTS:
                    near = [n for n in world.npcs.values() if "aria" in n.near]
                    if near:
                        px, py = world.players["aria"].position
                        nearest = min(near, key=lambda n: math.dist(n.position, (px, py)))
                        world.talk(nearest.id, "aria", KEY_INTENTS[event.key])
            if autopilot:
                t = world.time
                list(script.run_beats(world, t_prev, t))
                t_prev = t
                script.move(world, t)
                night = world.context["time_of_day"] == "night"
            else:
                keys = pygame.key.get_pressed()
                vx = (keys[pygame.K_RIGHT] - keys[pygame.K_LEFT]) * 5.0
                vy = (keys[pygame.K_DOWN] - keys[pygame.K_UP]) * 5.0
                px, py = world.players["aria"].position
                world.move_player("aria", (px + vx * dt, py + vy * dt))
            handle(world.update(dt))
            frame += 1
            last = args.frames and frame >= args.frames
            if last and args.screenshot:
                handle(world.drain())  # the screenshot shows lines still being decoded
            render(screen, world, names, bubbles, font, small, night)
            pygame.display.flip()
            if last:
                break
            if not headless:
                clock.tick(60)
        if args.screenshot:
            pygame.image.save(screen, args.screenshot)
            print(f"screenshot: {args.screenshot}")
    finally:
        world.close()
        gen.close()
        pygame.quit()
    return 0


def render(screen: pygame.Surface, world: World, names: dict[Any, str], bubbles: dict[Any, Bubble],
           font: pygame.font.Font, small: pygame.font.Font, night: bool) -> None:
    w, h = screen.get_size()
    screen.fill((28, 36, 64) if night else (112, 170, 92))
    px, py = world.players["aria"].position if "aria" in world.players else (0.0, 0.0)

    def to_screen(x: float, y: float) -> tuple[int, int]:
        return (int(w / 2 + (x - px) * SCALE), int(h / 2 + (y - py) * SCALE))

    street_y = to_screen(0, 0)[1]
    pygame.draw.rect(screen, (60, 60, 80) if night else (196, 170, 120), (0, street_y - 12, w, 24))
    for npc in world.npcs.values():
        sx, sy = to_screen(*npc.position)
        if not (-60 < sx < w + 60 and -60 < sy < h + 60):
            continue
        state = world.npc_state(npc.id)
        pygame.draw.circle(screen, (0, 0, 0, 60), (sx, sy), int(npc.radius * SCALE), width=1)
        pygame.draw.circle(screen, STATE_COLORS.get(state, (220, 220, 220)), (sx, sy), 9)
        label = small.render(f"{names.get(npc.id, npc.id)} · {state}", True, (240, 240, 240))
        screen.blit(label, (sx - label.get_width() // 2, sy + 11))
    for npc_id, bubble in list(bubbles.items()):
        if bubble.until < world.time or npc_id not in world.npcs:
            del bubbles[npc_id]
            continue
        draw_bubble(screen, font, bubble.text, to_screen(*world.npcs[npc_id].position))
    for player in world.players.values():
        sx, sy = to_screen(*player.position)
        color = (220, 40, 40) if player.reputation == "hostile" else (250, 220, 60)
        pygame.draw.polygon(screen, color, [(sx, sy - 9), (sx - 7, sy + 6), (sx + 7, sy + 6)])
    hud = font.render(f"t {world.time:5.1f}s  {world.context['time_of_day']}  lines {world.stats()['lines']}"
                      "   arrows: walk  1-5: talk  N: night", True, (250, 250, 250))
    screen.blit(hud, (8, 8))


if __name__ == "__main__":
    sys.exit(main())
