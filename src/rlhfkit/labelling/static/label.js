// The labelling page: keyboard and mouse, the ranking of K > 2 responses (by clicks, keys or
// drag and drop), a vote sent once, the list of shortcuts (`?`), the switch between rendered
// Markdown and raw text, and a changed vote's earlier answers filled in again.
//
// The vote's id is a UUID made when the page is shown; every retry of the submission sends the
// same id, so a vote the server stored before the connection dropped is not counted twice.
// After a vote the page is replaced by the next task's (location.replace): Back never returns
// to a task already voted on. This script never inserts markup: all text goes in through
// textContent.
"use strict";

(() => {
  const task = document.getElementById("task");
  if (!task) return;

  const taskId = Number(task.dataset.task);
  const k = Number(task.dataset.k);
  const voteId = newVoteId();
  const status = document.getElementById("status");
  const buttons = Array.from(task.querySelectorAll(".actions button"));
  const cards = Array.from(task.querySelectorAll(".rankable")); // by display slot
  const list = task.querySelector(".ranking");
  const orderText = document.getElementById("order");
  const submitButton = task.querySelector('[data-action="submit"]');
  const shortcuts = document.getElementById("shortcuts");
  const MAX_ATTEMPTS = 6;
  const MOVE_ON_MS = 1500; // long enough to read why the page moves on
  let order = []; // display slots placed so far, best first
  let sending = false;

  function newVoteId() {
    if (window.crypto.randomUUID) return window.crypto.randomUUID();
    // randomUUID exists only on https and localhost; a team server on the LAN is plain http.
    const bytes = window.crypto.getRandomValues(new Uint8Array(16));
    bytes[6] = (bytes[6] & 0x0f) | 0x40; // version 4
    bytes[8] = (bytes[8] & 0x3f) | 0x80; // RFC 4122 variant
    const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
  }

  function say(text, problem = false) {
    status.textContent = text;
    status.classList.toggle("problem", problem);
  }

  function extras() {
    const rated = task.querySelector('input[name="rating"]:checked');
    const flag = document.getElementById("flag").value.trim();
    return { rating: rated ? Number(rated.value) : null, flag: flag || null };
  }

  function setBusy(busy) {
    sending = busy;
    for (const button of buttons) button.disabled = busy;
    if (!busy) showOrder();
  }

  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  async function send(choice, slots) {
    if (sending) return;
    setBusy(true);
    const body = JSON.stringify({ id: voteId, task: taskId, choice, order: slots, ...extras() });
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt += 1) {
      let response = null;
      try {
        response = await fetch("/api/votes", {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          credentials: "same-origin",
          body,
        });
      } catch (error) {
        response = null; // no answer: the vote may or may not be stored; retry with its id
      }
      if (response && response.ok) {
        say("Saved.");
        window.location.replace("/");
        return;
      }
      if (response && response.status < 500) {
        await refused(response);
        return;
      }
      if (attempt < MAX_ATTEMPTS) {
        say(`Not saved yet: cannot reach the server; trying again (${attempt} of ${MAX_ATTEMPTS - 1})...`, true);
        await pause(400 * 2 ** (attempt - 1));
      }
    }
    say("Not saved: cannot reach the server. Vote again to retry.", true);
    setBusy(false);
  }

  // A vote the server refused: signed out, already voted (in another tab, say: that tab's
  // vote stands, and this page has nothing left to do), or a vote it cannot take.
  async function refused(response) {
    const answer = await response.json().catch(() => ({}));
    if (response.status === 401) {
      window.location.replace("/login");
      return;
    }
    if (response.status === 409 && / already voted on task \d+$/.test(answer.error || "")) {
      say("You have already voted on this task (in another tab?). On to the next one...");
      await pause(MOVE_ON_MS);
      window.location.replace("/");
      return;
    }
    say(`Not saved: ${answer.error || response.statusText}`, true);
    setBusy(false);
  }

  // ------------------------------------------------------------------------------ K = 2
  function choosePair(choice) {
    if (choice === "a") send("rank", [0, 1]);
    else if (choice === "b") send("rank", [1, 0]);
    else send(choice, null);
  }

  const pairKeys = {
    1: "a",
    ArrowLeft: "a",
    2: "b",
    ArrowRight: "b",
    " ": "tie",
    x: "bad",
    s: "skip",
  };

  // ------------------------------------------------------------------------------ K > 2
  // The cards stand in the list as the ranking so far: the placed ones first, best first,
  // then the others in their display order. However a card is placed (click, key, drag), the
  // list is rearranged at once, so what the labeller sees is the order they will submit.
  function arrange() {
    const wanted = [...order.map((slot) => cards[slot]), ...cards.filter((_, slot) => !order.includes(slot))];
    const now = Array.from(list.children);
    if (wanted.every((card, i) => now[i] === card)) return;
    const focused = document.activeElement; // moving a node takes the focus away from it
    for (const card of wanted) list.appendChild(card);
    if (cards.includes(focused)) focused.focus();
  }

  function showOrder() {
    if (!cards.length) return;
    arrange();
    for (const card of cards) {
      const place = order.indexOf(Number(card.dataset.slot));
      card.classList.toggle("placed", place >= 0);
      card.setAttribute("aria-selected", String(place >= 0));
      card.querySelector(".place").textContent = place >= 0 ? `placed ${ordinal(place + 1)}` : "";
    }
    orderText.textContent = order.length ? order.map((slot) => slot + 1).join(" > ") : "none yet";
    submitButton.disabled = sending || order.length !== k;
  }

  function ordinal(n) {
    const suffix = { 1: "st", 2: "nd", 3: "rd" }[n % 100 > 10 && n % 100 < 14 ? 0 : n % 10];
    return `${n}${suffix || "th"}`;
  }

  function toggle(slot) {
    if (sending) return;
    order = order.includes(slot) ? order.filter((s) => s !== slot) : [...order, slot];
    showOrder();
  }

  function place(slot) {
    if (!order.includes(slot)) toggle(slot);
  }

  function undo() {
    order = order.slice(0, -1);
    showOrder();
  }

  function submitRanking() {
    if (order.length === k) send("rank", order);
  }

  // Through the cards as they stand (placed first), not by slot, and no further than the
  // ends: a card just placed moves to the top with the focus, and Up from there wrapping to
  // the bottom card placed one the labeller never meant.
  function moveFocus(step) {
    const shown = Array.from(list.children);
    const now = shown.indexOf(document.activeElement);
    const next = now < 0 ? (step > 0 ? 0 : shown.length - 1) : now + step;
    shown[Math.min(Math.max(next, 0), shown.length - 1)].focus();
  }

  // Drag and drop, with pointer events (a mouse, a pen, or a finger on the grip; elsewhere a
  // finger scrolls the page). While dragged, the card takes the place of the card it passes
  // the middle of; dropped, it is placed after the placed cards above it (first if there is
  // none), and the list is arranged again. A press that does not move is a click.
  const DRAG_START_PX = 8;
  let drag = null; // { card, pointer, x, y, moving }
  let suppressClick = false; // the click that ends a drag is no click on the card

  function startDrag(card, event) {
    if (sending || event.button !== 0) return;
    drag = { card, pointer: event.pointerId, x: event.clientX, y: event.clientY, moving: false };
  }

  function dragOver(event) {
    if (!drag || event.pointerId !== drag.pointer) return;
    if (!drag.moving) {
      if (Math.hypot(event.clientX - drag.x, event.clientY - drag.y) < DRAG_START_PX) return;
      drag.moving = true;
      drag.card.classList.add("dragging");
      list.classList.add("dragging");
      window.getSelection().removeAllRanges();
    }
    event.preventDefault();
    const shown = Array.from(list.children);
    const from = shown.indexOf(drag.card);
    for (const [at, other] of shown.entries()) {
      if (other === drag.card) continue;
      const box = other.getBoundingClientRect();
      if (event.clientY < box.top || event.clientY > box.bottom) continue;
      // The middle, give or take a pixel or two (mouse positions are whole pixels).
      const middle = box.top + box.height / 2;
      if (from < at && event.clientY >= middle - 2) list.insertBefore(drag.card, other.nextSibling);
      else if (from > at && event.clientY <= middle + 2) list.insertBefore(drag.card, other);
      break;
    }
  }

  function endDrag(event, dropped) {
    if (!drag || event.pointerId !== drag.pointer) return;
    const { card, moving } = drag;
    drag = null;
    if (!moving) return;
    card.classList.remove("dragging");
    list.classList.remove("dragging");
    suppressClick = true;
    setTimeout(() => {
      suppressClick = false;
    }, 0);
    const slot = Number(card.dataset.slot);
    if (dropped) {
      const shown = Array.from(list.children);
      const above = shown.slice(0, shown.indexOf(card)).map((c) => Number(c.dataset.slot));
      const rest = order.filter((s) => s !== slot);
      const at = rest.filter((s) => above.includes(s)).length;
      order = [...rest.slice(0, at), slot, ...rest.slice(at)];
    }
    showOrder();
  }

  function rankKey(key) {
    const digit = Number(key);
    if (Number.isInteger(digit) && digit >= 1 && digit <= Math.min(k, 9)) return () => place(digit - 1);
    const focused = cards.indexOf(document.activeElement);
    const actions = {
      ArrowDown: () => moveFocus(1),
      ArrowUp: () => moveFocus(-1),
      " ": () => focused >= 0 && toggle(focused),
      Backspace: undo,
      Enter: submitRanking,
      e: () => send("tie", null),
      x: () => send("bad", null),
      s: () => send("skip", null),
    };
    return actions[key];
  }

  // ----------------------------------------------------------------------------- events
  for (const button of buttons) {
    button.addEventListener("click", () => {
      const { choice, action } = button.dataset;
      if (action === "submit") submitRanking();
      else if (action === "undo") undo();
      else if (k === 2) choosePair(choice);
      else send(choice, null);
    });
  }
  for (const card of cards) {
    card.addEventListener("click", (event) => {
      if (suppressClick || event.target.closest("a")) return; // a link in a response opens
      toggle(Number(card.dataset.slot));
    });
    card.addEventListener("pointerdown", (event) => startDrag(card, event));
  }
  if (list) {
    document.addEventListener("pointermove", dragOver);
    document.addEventListener("pointerup", (event) => endDrag(event, true));
    document.addEventListener("pointercancel", (event) => endDrag(event, false));
  }

  // The keys a focused control uses itself, which no shortcut may take: every key in a text
  // field, the arrows and Space on a rating, Space on a checkbox, Enter and Space on a button
  // or a link. The shortcuts have the rest, so a focused control never does something else
  // than it says.
  function ownedBy(target, key) {
    if (target instanceof HTMLInputElement && target.type === "radio") {
      return key === " " || key.startsWith("Arrow");
    }
    if (target instanceof HTMLInputElement && target.type === "checkbox") return key === " ";
    if (target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement) return true;
    if (target instanceof HTMLSelectElement) return true;
    const opens = target instanceof HTMLElement && target.tagName === "SUMMARY"; // the guidelines
    if (target instanceof HTMLButtonElement || target instanceof HTMLAnchorElement || opens) {
      return key === "Enter" || key === " ";
    }
    return false;
  }

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat || sending) return;
    if (shortcuts.open) return; // the list's own keys: Escape closes it (the dialog's own)
    const target = event.target;
    if (event.key === "Escape" && target instanceof HTMLInputElement) {
      target.blur(); // back to the shortcuts
      return;
    }
    if (ownedBy(target, event.key)) return;
    const pairAction = pairKeys[event.key] && (() => choosePair(pairKeys[event.key]));
    const action = event.key === "?" ? () => shortcuts.showModal() : k === 2 ? pairAction : rankKey(event.key);
    if (action) {
      event.preventDefault();
      action();
    }
  });

  document.getElementById("shortcuts-close").addEventListener("click", () => shortcuts.close());

  // The guidelines stay open or folded, and the responses rendered or raw, as the labeller
  // left them, from one task to the next.
  const guidelines = document.getElementById("guidelines");
  if (guidelines) {
    const KEY = "rlhfkit-guidelines-open";
    guidelines.open = window.localStorage.getItem(KEY) === "1";
    guidelines.addEventListener("toggle", () => window.localStorage.setItem(KEY, guidelines.open ? "1" : "0"));
  }
  const rawToggle = document.getElementById("raw-toggle");
  const RAW_KEY = "rlhfkit-raw-text";
  const showRaw = () => task.classList.toggle("raw", rawToggle.checked);
  rawToggle.checked = window.localStorage.getItem(RAW_KEY) === "1";
  showRaw();
  rawToggle.addEventListener("change", () => {
    window.localStorage.setItem(RAW_KEY, rawToggle.checked ? "1" : "0");
    showRaw();
  });

  // ------------------------------------------------------------- a vote being changed
  // A task that comes back after "Change my last vote" carries the vote taken back
  // (`data-previous`: choice, order as display slots best first, rating, flag): its rating,
  // flag and ranking are filled in again, and the earlier choice is named.
  function earlierChoice({ choice, order: slots }) {
    if (choice === "rank" && k === 2) return slots[0] === 0 ? "A is better" : "B is better";
    if (choice === "rank") return slots.map((slot) => slot + 1).join(" > ");
    const names = { tie: k === 2 ? "Tie" : "All equally good", bad: k === 2 ? "Both are bad" : "All are bad" };
    return names[choice] || "Skip";
  }

  function prefill(previous) {
    const rating = task.querySelector(`input[name="rating"][value="${Number(previous.rating)}"]`);
    if (rating) rating.checked = true;
    if (previous.flag) document.getElementById("flag").value = previous.flag;
    const slots = previous.order || [];
    const ranked = slots.length === k && slots.every((slot) => slot >= 0 && slot < k);
    if (k > 2 && previous.choice === "rank" && ranked) order = [...slots];
    say(`Your earlier vote: ${earlierChoice(previous)}`);
  }

  if (task.dataset.previous) prefill(JSON.parse(task.dataset.previous));
  showOrder();
})();
